"""twostep: deploy PyTorch encoder-decoder Transformers as two ONNX graphs with a KV cache."""

__version__ = "0.1.0"
