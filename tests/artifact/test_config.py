"""The model configuration (twostep/artifact/config.py): its JSON round trip."""

from __future__ import annotations

import json

from twostep.artifact.config import ModelConfig
from twostep.model.config import preset


def test_config_json_round_trip():
    config = preset("demo", 100, 120, d_k=8, d_v=16, logit_scale=0.5)
    assert ModelConfig.from_dict(json.loads(config.to_json())) == config
