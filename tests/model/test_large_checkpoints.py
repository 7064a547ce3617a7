"""What 3B checkpoints bring (issue 48) at a test's size: half-precision weights (the hub's bf16 and fp16
safetensors) import without a float32 copy of the model, to the numbers transformers computes in float32 from
the same weights; sharded weights (model.safetensors.index.json) with a shard missing or cut short are one
line and nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import hf_models
from cli_helpers import assert_user_error, leftovers, twostep
from twostep.model.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def marian_hf(tmp_path_factory):
    pytest.importorskip("transformers")
    return hf_models.marian_dir(tmp_path_factory.mktemp("marian-half") / "hf", train_steps=0)


def saved_as(source, out, dtype=None, shard_size=None):
    """The transformers directory `source` saved again by transformers, its weights in `dtype`, sharded."""
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(source)
    if dtype is not None:
        model = model.to(dtype)
    shutil.copytree(source, out)
    (out / "model.safetensors").unlink()
    model.save_pretrained(out, **({"max_shard_size": shard_size} if shard_size else {}))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_import_to_transformers_float32_numbers(marian_hf, tmp_path, dtype):
    from transformers import MarianMTModel

    half = saved_as(marian_hf, tmp_path / "half", dtype)
    assert "16" in json.loads((half / "config.json").read_text()).get("dtype", str(dtype))
    result = twostep("import", half, "--out", tmp_path / "ckpt")
    assert result.returncode == 0, result.stderr
    ours = load_checkpoint(tmp_path / "ckpt").model
    assert all(p.dtype == torch.float32 for p in ours.parameters())  # widened as written: float32 on disk
    theirs = MarianMTModel.from_pretrained(half, dtype=torch.float32).eval()  # the same weights, widened
    assert torch.equal(ours.src_embed.weight, theirs.model.shared.weight)
    ids = torch.tensor([[5, 9, 13, 21, 0]])
    mask = torch.ones_like(ids)
    start = torch.tensor([[theirs.config.decoder_start_token_id, 7, 11]])
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask, decoder_input_ids=start).logits
        from twostep.model.graphs import flatten, pairs

        cross = flatten(ours.encode(ids, mask))
        got, _ = ours.decode_step(start, mask, ours.empty_cache(1), pairs(cross))
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4, rtol=1e-4)


def test_sharded_weights_import_as_one(marian_hf, tmp_path):
    sharded = saved_as(marian_hf, tmp_path / "sharded", shard_size="40KB")
    assert len(set(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values())) > 2
    result = twostep("import", sharded, "--out", tmp_path / "ckpt")
    assert result.returncode == 0, result.stderr
    whole = twostep("import", marian_hf, "--out", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    weights = [(tmp_path / name / "model.safetensors").read_bytes() for name in ("ckpt", "whole")]
    assert weights[0] == weights[1]


def second_shard(path):
    return path / sorted(set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values()))[1]


def lose_a_shard(path):
    second_shard(path).unlink()


def cut_a_shard(path):
    shard = second_shard(path)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def name_a_tensor_no_shard_has(path):
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.encoder.layers.99.fc1.weight"] = second_shard(path).name
    index.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, fragments", [
    (lose_a_shard, ["model-00002-of-", "missing", "model.safetensors.index.json"]),
    (cut_a_shard, ["model-00002-of-", "cannot read safetensors"]),
    (name_a_tensor_no_shard_has, ["names 1 tensor(s) its shards lack", "layers.99.fc1.weight"]),
])
def test_a_shard_missing_or_cut_short_is_one_line_and_nothing_is_written(marian_hf, tmp_path, edit, fragments):
    sharded = saved_as(marian_hf, tmp_path / "sharded", shard_size="40KB")
    edit(sharded)
    out = tmp_path / "ckpt"
    assert_user_error(twostep("import", sharded, "--out", out), *fragments)
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_a_twostep_checkpoint_cut_short_is_one_line(tmp_path, tiny_ckpt):
    weights = tiny_ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    assert_user_error(twostep("export", tiny_ckpt, "--out", tmp_path / "art"), "model.safetensors", "cannot read")
    assert not (tmp_path / "art").exists()
