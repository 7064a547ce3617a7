"""Whether a T5-family decoder's output is scaled by d_model ** -0.5 (twostep/model/hf/t5.py scaled_output), for
every way a config.json can say it or not: decided as transformers decides it, asked of transformers itself."""

from __future__ import annotations

import json

import pytest
import torch

from twostep.model.hf.common import HFModel
from twostep.model.hf.t5 import scaled_output

CONFIGS = [{}, {"tie_word_embeddings": True}, {"tie_word_embeddings": False}, {"scale_decoder_outputs": False},
           {"scale_decoder_outputs": True, "tie_word_embeddings": False}]


def hf_dir(tmp_path, config: dict) -> HFModel:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", **config}))
    return HFModel(tmp_path)


@pytest.mark.parametrize("config", CONFIGS, ids=json.dumps)
def test_t5_scales_as_transformers_config_decides(tmp_path, config):
    """No tie keys at all is T5 v1.0's tied and scaled output layer (T5Config: tie_word_embeddings absent is not
    False)."""
    from transformers import T5Config

    want = T5Config.from_pretrained(hf_dir(tmp_path, config).path).scale_decoder_outputs
    assert scaled_output(hf_dir(tmp_path, config), "t5") is want
    if not config:
        assert want is True


def test_mt5_never_scales(tmp_path):
    """MT5ForConditionalGeneration gives lm_head(the decoder's output) whatever its config says: no scale."""
    from transformers import MT5Config, MT5ForConditionalGeneration

    torch.manual_seed(0)
    model = MT5ForConditionalGeneration(MT5Config(vocab_size=16, d_model=8, d_kv=4, d_ff=8, num_layers=1,
                                                  num_heads=2)).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[3, 4, 1]]), decoder_input_ids=torch.tensor([[0, 5]]),
                    output_hidden_states=True)
        assert torch.allclose(out.logits, model.lm_head(out.decoder_hidden_states[-1]))
    for config in CONFIGS:
        assert scaled_output(hf_dir(tmp_path, config), "mt5") is False
