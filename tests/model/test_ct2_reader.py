"""twostep's model.bin reader (twostep/model/ct2.py) on small files written here in CTranslate2's format (its writer:
ctranslate2/specs/model_spec.py `_serialize`), for what the converted fixtures never hold: binary versions before
4, bfloat16 and int16 weights, bytes after the last variable; and the spec checks that need no whole model."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from twostep.errors import BadCheckpoint
from twostep.model.ct2 import CT2Model, read_model_bin, refuse_features, special_ids, vocabulary_table

DTYPE_IDS = {np.float32: 0, np.int8: 1, np.int16: 2, np.int32: 3, np.float16: 4}


def string(text: str) -> bytes:
    return struct.pack("<H", len(text) + 1) + text.encode() + b"\0"


def model_bin(variables: dict[str, np.ndarray | tuple[bytes, tuple[int, ...]]], version: int = 6,
              aliases: dict[str, str] | None = None) -> bytes:
    """A model.bin of `version`: each variable an array, or (raw bfloat16 bytes, shape) for dtype id 5."""
    out = struct.pack("<I", version)
    if version >= 2:
        out += string("TransformerSpec") + struct.pack("<I", 7)
    out += struct.pack("<I", len(variables))
    for name, value in variables.items():
        raw, shape, type_id = (value[0], value[1], 5) if isinstance(value, tuple) else \
            (value.tobytes(), value.shape, DTYPE_IDS[value.dtype.type])
        out += string(name) + struct.pack(f"<B{len(shape)}I", len(shape), *shape)
        if version >= 4:
            out += struct.pack("<BI", type_id, len(raw))
        else:
            out += struct.pack("<BI", value.dtype.itemsize, value.size)
        out += raw
    if version >= 3:
        aliases = aliases or {}
        out += struct.pack("<I", len(aliases)) + b"".join(string(a) + string(n) for a, n in aliases.items())
    return out


def read(tmp_path: Path, data: bytes):
    (tmp_path / "model.bin").write_bytes(data)
    return read_model_bin(tmp_path / "model.bin")


WEIGHT = np.array([[0.5, -1.25, 3.0], [2.0, 0.0, -0.75]], np.float32)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_binary_versions_before_4_give_item_sizes_and_element_counts(tmp_path, version):
    """Before version 4 a variable has an item size and an element count, not a dtype and a byte count; version 1
    has no spec name, versions 1 and 2 no aliases."""
    ints = np.array([7, -3], np.int16)
    got_version, spec, revision, variables = read(tmp_path, model_bin({"w": WEIGHT, "i": ints}, version))
    assert (got_version, spec, revision) == ((version, "", 1) if version == 1 else (version, "TransformerSpec", 7))
    assert variables["w"].dtype == np.float32 and np.array_equal(variables["w"], WEIGHT)
    assert variables["i"].dtype == np.int16 and np.array_equal(variables["i"], ints)


def test_bfloat16_widens_to_the_float32_it_is_the_high_half_of(tmp_path):
    values = np.array([1.5, -2.0, 3.140625, 1e-3, -65280.0], np.float32)  # each exact in bfloat16 but 1e-3
    raw = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    _, _, _, variables = read(tmp_path, model_bin({"w": (raw, (5,))}))
    want = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert variables["w"].dtype == np.float32 and np.array_equal(variables["w"], want)
    assert want[2] == 3.140625 and want[4] == -65280.0


def test_int16_weights_are_divided_by_their_one_scale(tmp_path):
    """int16 (CTranslate2's --quantization int16) has one scale for the whole weight, int8 one a row."""
    int16 = np.array([[1000, -2000], [300, 4]], np.int16)
    int8 = np.array([[100, -50], [10, 127]], np.int8)
    scales = np.array([2.0, 4.0], np.float32)
    _, _, _, variables = read(tmp_path, model_bin({"a": int16, "a_scale": np.array(8.0, np.float32), "b": int8,
                                                   "b_scale": scales}))
    ct2 = CT2Model(tmp_path, 6, "TransformerSpec", 7, variables)
    assert np.array_equal(ct2.weight("a").numpy(), int16.astype(np.float32) / 8)
    assert np.array_equal(ct2.weight("b").numpy(), int8.astype(np.float32) / scales[:, None])


def test_bytes_after_the_last_variable_are_refused(tmp_path):
    data = model_bin({"w": WEIGHT}, aliases={"v": "w"})
    assert np.array_equal(read(tmp_path, data)[3]["v"], WEIGHT)
    with pytest.raises(BadCheckpoint, match="4 bytes after the last variable"):
        read(tmp_path, data + b"\0\0\0\0")


def test_a_repeated_vocabulary_token_keeps_its_first_id():
    """As vocabulary.cc's map does: the table for the tokenizer and the special ids alike."""
    tokens = ["<unk>", "<s>", "</s>", "a", "</s>", "a", "<s>"]
    assert vocabulary_table(tokens) == b'{"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}'
    ct2 = CT2Model(Path("m"), 6, "TransformerSpec", 7, {}, source_vocab=tokens, target_vocab=tokens,
                   config={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "decoder_start_token": "<s>"})
    assert special_ids(ct2) == {"unk": 0, "eos": 2, "start": 1, "bos": 1, "pad": 0}


def test_a_layer_norm_without_beta_is_rmsnorm_and_refused():
    """A gamma without its beta is CTranslate2's RMSNorm (LayerNormSpec(rms_norm=True)), which twostep's LayerNorm
    would run as a LayerNorm with no bias: wrong numbers, not an error, if it were not refused."""
    weight = np.zeros((4, 4), np.float32)
    variables = {"decoder/layer_0/attention/linear_0/weight": weight,
                 "encoder/layer_0/ffn/layer_norm/gamma": np.ones(4, np.float32),
                 "encoder/layer_0/self_attention/layer_norm/gamma": np.ones(4, np.float32),
                 "encoder/layer_0/self_attention/layer_norm/beta": np.zeros(4, np.float32)}
    with pytest.raises(BadCheckpoint, match=r"RMSNorm \(encoder/layer_0/ffn/layer_norm/gamma has no beta\)"):
        refuse_features(CT2Model(Path("m"), 6, "TransformerSpec", 7, variables))
    variables["encoder/layer_0/ffn/layer_norm/beta"] = np.zeros(4, np.float32)
    refuse_features(CT2Model(Path("m"), 6, "TransformerSpec", 7, variables))
