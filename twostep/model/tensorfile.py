"""safetensors files written tensor by tensor. safetensors' own save_file serializes every tensor into one
buffer before it writes (a whole copy of the model in memory: 12 GB at MADLAD-400-3B's size); the format is a
header and the tensors' bytes one after another, so this writes the header and then each tensor in slices of
CHUNK bytes, converted to float32 (a bf16 or fp16 checkpoint's tensors) slice by slice as they go. What is read
back is safetensors' own reader's (load_file), which memory-maps the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

CHUNK = 64 << 20  # bytes converted and written at once
NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL"}


def stored_dtype(tensor: torch.Tensor) -> torch.dtype:
    """Floating point tensors are stored in float32 (the precision twostep traces and checks in); others as
    they are."""
    return torch.float32 if tensor.is_floating_point() else tensor.dtype


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write `tensors` to `path` as a safetensors file, floating point ones as float32; returns its bytes."""
    header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for name, tensor in tensors.items():
        dtype = stored_dtype(tensor)
        size = tensor.numel() * dtype.itemsize
        header[name] = {"dtype": NAMES[dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            flat = tensor.detach().reshape(-1)  # a view where the tensor is contiguous (it is, memory-mapped)
            step = max(1, CHUNK // max(1, flat.element_size()))
            for start in range(0, flat.numel(), step):
                piece = flat[start : start + step].to(stored_dtype(tensor)).contiguous()
                out.write(piece.view(torch.uint8).numpy().data if piece.numel() else b"")
        return out.tell()
