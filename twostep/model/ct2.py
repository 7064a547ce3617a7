"""CTranslate2's model directories, read by twostep itself (no ctranslate2 dependency): `model.bin`, `config.json`
and the vocabularies, into twostep's model family.

`model.bin` is CTranslate2's own format (its writer: ctranslate2/specs/model_spec.py `_serialize`; its reader:
src/models/model.cc `Model::load`), little-endian:

    u32 binary version (1 to 6)
    version >= 2: string spec name, u32 spec revision          string: u16 length (with the NUL), bytes, NUL
    u32 variable count, then each: string name, u8 rank, u32 x rank dims,
        version >= 4: u8 dtype id (float32, int8, int16, int32, float16, bfloat16), u32 byte count
        else:         u8 item size (4 float32, 2 int16, 1 int8), u32 element count
        the bytes
    version >= 3: u32 alias count, then each: string alias, string name (name_scale is aliased alike)

A spec's scalars (num_heads, pre_norm, activation, ...) are variables of rank 0, its strings int8 arrays of
UTF-8. Quantized weights are dequantized as CTranslate2 does for float32 compute: int8 rows divided by their
`weight_scale` (127 / the row's max), int16 by its one scale; float16 and bfloat16 widen to float32.

TransformerSpec (revisions 1 to 7) maps onto ModelConfig as config features: pre- or post-norm, the final norms,
the activation, stored position tables (a table per stack, as mBART's) or CTranslate2's computed sinusoid
(fairseq's, from position 1), scale_embeddings, layernorm_embedding, shared or separate embeddings, the output
projection with or without bias, `scale_outputs`, the fused QKV (`linear_0`) and the cross-attention's fused K/V
(`linear_1`) split into twostep's projections. Every feature twostep does not run is refused with one line
naming it (FEATURES).
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostep.artifact.config import ModelConfig
from twostep.artifact.tokenizer import Languages, TargetLanguage, TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.files import read_json
from twostep.model.hf.common import SOURCE_SPM, SOURCE_VOCAB, TARGET_SPM, TARGET_VOCAB, Imported
from twostep.model.importers import Mapper
from twostep.model.transformer import Transformer, position_table

BINARY_VERSIONS = range(1, 7)  # what CTranslate2 4.x still reads (current_binary_version 6)
SPECS = {"": 8, "TransformerBase": 8, "TransformerBig": 16, "TransformerSpec": None}  # name -> implied heads
LATEST_REVISION = 7
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
ITEM_SIZES = {4: np.float32, 2: np.int16, 1: np.int8}  # binary versions < 4
# ops::ActivationType; twostep's name, or None where twostep has none
ACTIVATIONS = {0: "relu", 1: "gelu_tanh", 2: "silu", 3: "gelu", 4: None, 5: None, 6: None}
ACTIVATION_NAMES = {4: "GELUSigmoid", 5: "Tanh", 6: "Sigmoid"}

# A variable name's last part or scope -> the TransformerSpec feature it belongs to, which twostep does not run.
FEATURES = {
    "relative_position_keys": "Shaw-style relative positions (relative_position_keys/values)",
    "relative_asymmetric_position_keys": "asymmetric relative positions",
    "relative_attention_bias": "T5's relative attention bias",
    "rotary_dim": "rotary position embeddings",
    "num_heads_kv": "multi-query / grouped-query attention (num_heads_kv)",
    "multi_query": "multi-query attention",
    "linear_0_noact": "a GLU feed-forward (ffn_glu)",
    "q_norm": "query/key norms (qk_norm)",
    "v_norm": "value norms (v_norm)",
    "memory_kv": "merged encoder attention",
    "project_in": "project_in/project_out layers",
    "input_layer_norm": "pre-and-post layer norms or a parallel residual",
    "shared_layer_norm": "a parallel residual with a shared layer norm",
    "sliding_window": "sliding-window attention",
    "final_logit_softcapping": "final logit soft-capping",
    "layer_scalar": "a per-layer output scalar",
    "weight_zero": "zero-point (AWQ) quantization",
    "embeddings_1": "several source embeddings (source features)",
    "alibi": "ALiBi attention biases",
}


@dataclass
class CT2Model:
    """A CTranslate2 model directory, read: the spec, every variable (aliases resolved, quantized ones kept with
    their scales until `weight` asks), config.json and the vocabularies."""

    path: Path | zipfile.Path
    binary_version: int
    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    config: dict[str, Any] = field(default_factory=dict)
    source_vocab: list[str] = field(default_factory=list)
    target_vocab: list[str] = field(default_factory=list)
    shared_vocab: bool = True

    @classmethod
    def read(cls, path: Path | zipfile.Path) -> CT2Model:
        """A model directory: a Path, or a folder inside a zip file (an Argos package), read in place."""
        binary = path / "model.bin"
        if not binary.is_file():
            raise BadCheckpoint(f"{path}: no model.bin; is this a CTranslate2 model directory?")
        version, spec, revision, variables = read_model_bin(binary)
        if spec not in SPECS:
            raise BadCheckpoint(f"{binary}: a {spec} model; twostep imports CTranslate2's encoder-decoder "
                                "TransformerSpec (decoder-only, encoder-only and speech models are other specs)")
        if revision > LATEST_REVISION:
            raise BadCheckpoint(f"{binary}: TransformerSpec revision {revision}; twostep reads revisions up to "
                                f"{LATEST_REVISION}")
        model = cls(path, version, spec, revision, variables)
        model.legacy_attributes()
        model.config = model.read_config()
        model.read_vocabularies()
        return model

    def legacy_attributes(self) -> None:
        """What older revisions kept elsewhere (models/transformer.cc): V1 names, heads by spec name, top-level
        attributes for both stacks."""
        if self.revision == 1:
            self.variables = {v1_name(k): v for k, v in self.variables.items()}
        if self.revision < 3 and "num_heads" not in self.variables:
            self.variables["num_heads"] = np.array(SPECS[self.spec] or 8, np.int16)
        if self.revision < 5:
            for key in ("num_heads", "pre_norm", "activation", "embeddings_merge", "alignment_layer",
                        "alignment_heads"):
                for side in ("encoder", "decoder"):
                    if key in self.variables and f"{side}/{key}" not in self.variables:
                        self.variables[f"{side}/{key}"] = self.variables[key]
                self.variables.pop(key, None)

    def read_config(self) -> dict[str, Any]:
        """config.json; binary versions < 6 kept these in model.bin (models/sequence_to_sequence.cc)."""
        file = self.path / "config.json"
        config = read_json(file, BadCheckpoint) if file.is_file() else {}
        if not isinstance(config, dict):
            raise BadCheckpoint(f"{file}: expected a JSON object")
        if self.binary_version < 6:
            for key, default in (("unk_token", "<unk>"), ("bos_token", "<s>"), ("eos_token", "</s>")):
                config.setdefault(key, self.string(key, default))
            config.setdefault("add_source_bos", self.flag("with_source_bos", False))
            config.setdefault("add_source_eos", self.flag("with_source_eos", False))
            if self.flag("user_decoder_start_tokens", False):
                config.setdefault("decoder_start_token", None)
            else:
                start = "bos_token" if self.flag("with_target_bos", True) else "eos_token"
                config.setdefault("decoder_start_token", config[start])
        for key, default in (("unk_token", "<unk>"), ("bos_token", "<s>"), ("eos_token", "</s>"),
                             ("decoder_start_token", "<s>"), ("add_source_bos", False), ("add_source_eos", False)):
            config.setdefault(key, default)
        return config

    def read_vocabularies(self) -> None:
        """shared_vocabulary, else target_vocabulary and source_vocabulary (.json, else .txt), as
        models/model_reader.cc looks for them; the unk token is appended where a vocabulary lacks it."""
        shared = self.vocabulary("shared_vocabulary")
        if shared is not None:
            self.source_vocab = self.target_vocab = shared
            return
        self.shared_vocab = False
        target = self.vocabulary("target_vocabulary")
        source = self.vocabulary("source_vocabulary")
        if source is None and (self.path / "source_1_vocabulary.json").is_file():
            raise BadCheckpoint(f"{self.path}: several source vocabularies (source features); twostep imports "
                                "models with one")
        if target is None or source is None:
            raise BadCheckpoint(f"{self.path}: no vocabulary (shared_vocabulary.json or .txt, or source_ and "
                                "target_vocabulary); copy the model's vocabulary files with it")
        self.source_vocab, self.target_vocab = source, target

    def vocabulary(self, name: str) -> list[str] | None:
        as_json, as_text = self.path / f"{name}.json", self.path / f"{name}.txt"
        if as_json.is_file():
            tokens = read_json(as_json, BadCheckpoint)
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise BadCheckpoint(f"{as_json}: expected a JSON list of tokens")
        elif as_text.is_file():
            try:
                lines = as_text.read_text(encoding="utf-8").split("\n")
            except UnicodeDecodeError as exc:
                raise BadCheckpoint(f"{as_text}: not UTF-8 text ({exc})") from None
            if lines and lines[-1] == "":
                lines.pop()
            if lines and all(line.endswith("\r") for line in lines):  # vocabulary.cc keeps other CRs
                lines = [line[:-1] for line in lines]
            tokens = lines
        else:
            return None
        unk = self.config.get("unk_token", "<unk>")
        return tokens if unk in tokens else [*tokens, unk]

    # The spec's attributes (rank-0 variables), as Model::get_attribute_with_default / get_flag_with_default.
    def has(self, name: str) -> bool:
        return name in self.variables

    def attribute(self, name: str, default: float) -> float:
        value = self.variables.get(name)
        return default if value is None else value.reshape(-1)[0].item()

    def flag(self, name: str, default: bool) -> bool:
        return bool(self.attribute(name, default))

    def string(self, name: str, default: str) -> str:
        value = self.variables.get(name)
        return default if value is None else value.astype(np.int8).tobytes().decode("utf-8")

    def weight(self, name: str) -> torch.Tensor:
        """A variable in float32, dequantized as CTranslate2 does for float32 compute (x / scale)."""
        value = self.variables[name]
        scale = self.variables.get(f"{name}_scale")
        out = torch.from_numpy(value.astype(np.float32))
        if scale is not None and value.dtype in (np.int8, np.int16):
            scale_t = torch.from_numpy(scale.astype(np.float32))
            out = out / (scale_t.reshape(-1, *([1] * (out.dim() - 1))) if scale_t.numel() > 1 else scale_t)
        return out

    @property
    def weight_dtype(self) -> str:
        """The dtype of its quantizable weights (what CTranslate2's converter --quantization wrote)."""
        value = self.variables.get("encoder/layer_0/ffn/linear_0/weight")
        return "?" if value is None else str(value.dtype)


def read_model_bin(path: Path | zipfile.Path) -> tuple[int, str, int, dict[str, np.ndarray]]:
    try:
        data = path.read_bytes()
    except (OSError, zipfile.BadZipFile) as exc:
        raise BadCheckpoint(f"{path}: cannot read it ({exc})") from None
    reader = Reader(data, path)
    version = reader.u32()
    if version not in BINARY_VERSIONS:
        raise BadCheckpoint(f"{path}: CTranslate2 binary version {version}; twostep reads versions "
                            f"{BINARY_VERSIONS.start} to {BINARY_VERSIONS.stop - 1} (is this a model.bin?)")
    spec, revision = ("", 1) if version < 2 else (reader.string(), reader.u32())
    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.u32()):
        name = reader.string()
        shape = tuple(reader.unpack(f"<{reader.u8()}I"))
        if version >= 4:
            type_id = reader.u8()
            if type_id not in DTYPES:
                raise BadCheckpoint(f"{path}: variable {name} has an unknown dtype id {type_id}")
            dtype, size = DTYPES[type_id], reader.u32()
        else:
            item = reader.u8()
            if item not in ITEM_SIZES:
                raise BadCheckpoint(f"{path}: variable {name} has an unknown item size {item}")
            dtype, size = ITEM_SIZES[item], reader.u32() * item
        count = math.prod(shape)
        raw = reader.take(size)
        variables[name] = as_array(raw, dtype, shape, count, name, path)
    if version >= 3:
        for _ in range(reader.u32()):
            alias, name = reader.string(), reader.string()
            if name not in variables:
                raise BadCheckpoint(f"{path}: alias {alias} names a missing variable {name}")
            variables[alias] = variables[name]
            if f"{name}_scale" in variables:
                variables[f"{alias}_scale"] = variables[f"{name}_scale"]
    if reader.offset != len(data):
        raise BadCheckpoint(f"{path}: {len(data) - reader.offset} bytes after the last variable; not a CTranslate2 "
                            "model.bin of this version")
    return version, spec, revision, variables


def as_array(raw: bytes, dtype: Any, shape: tuple[int, ...], count: int, name: str, path: Path) -> np.ndarray:
    if dtype == "bfloat16":  # the high half of a float32
        if len(raw) != 2 * count:
            raise BadCheckpoint(f"{path}: variable {name} has {len(raw)} bytes, expected {2 * count}")
        halves = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
        return halves.view(np.float32).reshape(shape)
    if len(raw) != np.dtype(dtype).itemsize * count:
        raise BadCheckpoint(f"{path}: variable {name} has an invalid payload size ({len(raw)} bytes for shape "
                            f"{shape} of {np.dtype(dtype).name})")
    return np.frombuffer(raw, dtype).reshape(shape)


class Reader:
    """Little-endian fields of a bytes object; running past its end is a truncated file."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.path, self.offset = data, path, 0

    def take(self, n: int) -> bytes:
        if self.offset + n > len(self.data):
            raise BadCheckpoint(f"{self.path}: truncated ({len(self.data)} bytes; a field at byte {self.offset} "
                                f"needs {n} more)")
        out = self.data[self.offset : self.offset + n]
        self.offset += n
        return out

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def u8(self) -> int:
        return self.unpack("<B")[0]

    def u32(self) -> int:
        return self.unpack("<I")[0]

    def string(self) -> str:
        raw = self.take(self.unpack("<H")[0])
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise BadCheckpoint(f"{self.path}: a name that is not UTF-8 at byte {self.offset}; not a model.bin") \
                from None


def v1_name(name: str) -> str:
    """Binary version 1's OpenNMT-tf names (models/transformer.cc map_v1_variable_name)."""
    for old, new in (("transformer/", ""), (":0", ""), ("w_embs", "embeddings/weight"), ("kernel", "weight"),
                     ("LayerNorm", "layer_norm"), ("dense", "projection"), ("conv1d_", "linear_"),
                     ("conv1d", "linear_0")):
        name = name.replace(old, new, 1)
    if "encoder" in name:
        return name.replace("multi_head", "self_attention", 1)
    return name.replace("masked_multi_head", "self_attention", 1).replace("multi_head", "attention", 1)


# --- TransformerSpec -> twostep's model ---


def refuse_features(ct2: CT2Model) -> None:
    """One line naming the first spec feature twostep does not run (a name scope or attribute that holds it)."""
    for name in sorted(ct2.variables):
        parts = name.split("/")
        for part in parts:
            feature = FEATURES.get(part)
            if feature and (part not in ("alibi", "multi_query")
                            or ct2.flag(name, False)):
                raise BadCheckpoint(f"{ct2.path}: the model uses {feature} ({name}), which twostep's model does "
                                    "not run")
        if parts[-1] == "gamma" and f"{'/'.join(parts[:-1])}/beta" not in ct2.variables:
            raise BadCheckpoint(f"{ct2.path}: the model uses RMSNorm ({name} has no beta), which twostep's model "
                                "does not run")
    if not ct2.has("decoder/layer_0/attention/linear_0/weight"):
        raise BadCheckpoint(f"{ct2.path}: the decoder has no encoder attention; twostep imports encoder-decoder "
                            "models")
    if ct2.config.get("multi_query_attention"):
        raise BadCheckpoint(f"{ct2.path}: the model uses multi-query attention (config.json), which twostep's model "
                            "does not run")
    if ct2.config.get("quantization_type", 0) not in (0, None):
        raise BadCheckpoint(f"{ct2.path}: AWQ-quantized weights (quantization_type "
                            f"{ct2.config['quantization_type']}); twostep reads CTranslate2's own quantization")
    for side in ("encoder", "decoder"):
        code = int(ct2.attribute(f"{side}/activation", 0))
        if ACTIVATIONS.get(code) is None:
            raise BadCheckpoint(f"{ct2.path}: the {side} uses the {ACTIVATION_NAMES.get(code, code)} activation, "
                                "which twostep's model does not run")


def stack_value(ct2: CT2Model, what: str, key: str, default: float) -> float:
    values = {side: ct2.attribute(f"{side}/{key}", default) for side in ("encoder", "decoder")}
    if values["encoder"] != values["decoder"]:
        raise BadCheckpoint(f"{ct2.path}: the encoder and decoder differ in {what} ({values['encoder']} and "
                            f"{values['decoder']}); twostep's model has one for both stacks")
    return values["encoder"]


def count_layers(ct2: CT2Model, side: str) -> int:
    n = 0
    while ct2.has(f"{side}/layer_{n}/ffn/linear_0/weight"):
        n += 1
    if n == 0:
        raise BadCheckpoint(f"{ct2.path}: no {side} layers ({side}/layer_0/...); not a TransformerSpec model")
    return n


def embedding_key(ct2: CT2Model, side: str) -> str:
    for key in (f"{side}/embeddings/weight", f"{side}/embeddings_0/weight"):
        if ct2.has(key):
            return key
    raise BadCheckpoint(f"{ct2.path}: no {side} embeddings")


def embedding_scale(ct2: CT2Model, side: str, d_model: int) -> bool:
    """Whether embeddings are multiplied by sqrt(d_model) (transformer.cc build_embeddings_scale)."""
    name = f"{side}/scale_embeddings"
    if not ct2.has(name):
        name = f"{side}/embeddings/multiply_by_sqrt_depth"
    value = ct2.variables.get(name)
    if value is None:
        return True
    if value.dtype == np.int8:
        return bool(value.reshape(-1)[0])
    scale = float(value.reshape(-1)[0])
    if scale == 1.0:
        return False
    if math.isclose(scale, math.sqrt(d_model), rel_tol=1e-6):
        return True
    raise BadCheckpoint(f"{ct2.path}: {name} is {scale}; twostep scales embeddings by sqrt(d_model) or not at all")


def ct2_config(ct2: CT2Model, max_positions: int) -> tuple[ModelConfig, dict[str, int]]:
    """The model config of a TransformerSpec, and its special ids (unk, bos, eos, start, pad) by name."""
    refuse_features(ct2)
    src_key, tgt_key = embedding_key(ct2, "encoder"), embedding_key(ct2, "decoder")
    src_rows, d_model = ct2.variables[src_key].shape
    tgt_rows = ct2.variables[tgt_key].shape[0]
    for vocab, rows, what in ((ct2.source_vocab, src_rows, "source"), (ct2.target_vocab, tgt_rows, "target")):
        if len(vocab) != rows:
            raise BadCheckpoint(f"{ct2.path}: the {what} vocabulary has {len(vocab)} tokens but the {what} "
                                f"embedding has {rows} rows: the vocabulary files do not belong to these weights")
    heads = int(stack_value(ct2, "attention heads", "num_heads", 8))
    pre_norm = bool(stack_value(ct2, "norm placement (pre_norm)", "pre_norm", True))
    activation = ACTIVATIONS[int(stack_value(ct2, "activations", "activation", 0))]
    scales = {side: embedding_scale(ct2, side, d_model) for side in ("encoder", "decoder")}
    if scales["encoder"] != scales["decoder"]:
        raise BadCheckpoint(f"{ct2.path}: one stack scales its embeddings and the other does not; twostep's model "
                            "does both or neither")
    d_ff = ct2.variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    head_dim = int(ct2.attribute("encoder/layer_0/self_attention/head_dim", d_model // heads))
    stored = ct2.has("encoder/position_encodings/encodings")
    if stored != ct2.has("decoder/position_encodings/encodings"):
        raise BadCheckpoint(f"{ct2.path}: one stack stores its position encodings and the other computes them; "
                            "twostep's model does one for both")
    if stored:
        max_positions = min(ct2.variables[f"{s}/position_encodings/encodings"].shape[0] for s in ("encoder", "decoder"))
    layer_norm = {ct2.has(f"{s}/layernorm_embedding/gamma") for s in ("encoder", "decoder")}
    if len(layer_norm) > 1:
        raise BadCheckpoint(f"{ct2.path}: one stack has layernorm_embedding and the other not; twostep's model has "
                            "both or neither")
    queries_scale = ct2.attribute("encoder/layer_0/self_attention/queries_scale", 1 / math.sqrt(head_dim))
    if not math.isclose(queries_scale, 1 / math.sqrt(head_dim), rel_tol=1e-6):
        raise BadCheckpoint(f"{ct2.path}: queries_scale {queries_scale} (not 1/sqrt(head_dim)), which twostep's model "
                            "does not run")
    n_decoder_layers = count_layers(ct2, "decoder")
    alignment_layer = int(ct2.attribute("decoder/alignment_layer", -1))
    alignment_heads = int(ct2.attribute("decoder/alignment_heads", 1)) or heads  # 0: every head
    if not -n_decoder_layers <= alignment_layer < n_decoder_layers or not 0 < alignment_heads <= heads:
        raise BadCheckpoint(f"{ct2.path}: alignment_layer {alignment_layer} / alignment_heads {alignment_heads} do "
                            f"not fit its {n_decoder_layers} decoder layers of {heads} heads")
    eps = ct2.config.get("layer_norm_epsilon")
    ids = special_ids(ct2)
    cfg = ModelConfig(
        src_vocab_size=src_rows, tgt_vocab_size=tgt_rows, d_model=d_model, n_heads=heads, d_ff=d_ff,
        n_encoder_layers=count_layers(ct2, "encoder"), n_decoder_layers=n_decoder_layers,
        alignment_heads=alignment_heads, alignment_layer=alignment_layer,
        max_positions=max_positions, dropout=0.0, norm_placement="pre" if pre_norm else "post",
        norm_eps=1e-5 if eps is None else float(eps), attn_bias=True, generator_bias=True,
        d_k=head_dim if head_dim * heads != d_model else None, d_v=head_dim if head_dim * heads != d_model else None,
        scale_embedding=scales["encoder"], embed_norm=layer_norm == {True},
        encoder_final_norm=ct2.has("encoder/layer_norm/gamma"), decoder_final_norm=ct2.has("decoder/layer_norm/gamma"),
        share_embeddings=src_key == tgt_key or (ct2.variables[src_key] is ct2.variables[tgt_key]),
        tie_generator=ct2.variables[tgt_key] is ct2.variables["decoder/projection/weight"],
        logit_scale=float(ct2.attribute("decoder/scale_outputs", 1.0)), activation=activation,
        positions="learned" if stored else "fairseq", position_offset=0 if stored else 1,
        zero_start_embedding=ct2.flag("decoder/start_from_zero_embedding", False),
        decoder_start_id=ids["start"], pad_id=ids["pad"], unk_id=ids["unk"], bos_id=ids["bos"], eos_id=ids["eos"])
    return cfg, ids


def special_ids(ct2: CT2Model) -> dict[str, int]:
    """unk, bos, eos and the decoder's start from config.json's tokens; pad (which decoding never needs, but a
    batch pads with) is <blank> or <pad> where the vocabulary has one, else unk."""
    target = {token: i for i, token in reversed(list(enumerate(ct2.target_vocab)))}  # the first id of a token
    c = ct2.config
    start = c.get("decoder_start_token")
    if start is None:
        raise BadCheckpoint(f"{ct2.path / 'config.json'}: decoder_start_token is null (the caller gives the start "
                            "token in a target prefix); twostep needs the model's start token")
    ids = {}
    for key, token in (("unk", c["unk_token"]), ("eos", c["eos_token"]), ("start", start), ("bos", c["bos_token"])):
        if key == "bos" and token not in target:  # used only to start the decoder, which `start` does
            ids["bos"] = ids["start"]
            continue
        if key == "start" and token not in target and ct2.flag("decoder/start_from_zero_embedding", False):
            # ct2-marian-converter's <s>, which Marian's vocabulary lacks: CTranslate2 reads it as unk, whose row
            # the zero start embedding never reads
            ids["start"] = ids["unk"]
            continue
        if token not in target:
            raise BadCheckpoint(f"{ct2.path}: config.json's {key} token {token!r} is not in the target vocabulary")
        ids[key] = target[token]
    ids["pad"] = next((target[t] for t in ("<blank>", "<pad>") if t in target), ids["unk"])
    return ids


def ct2_state_dict(ct2: CT2Model) -> dict[str, torch.Tensor]:
    """Every weight in float32 (dequantized), by CTranslate2's name; attributes and scales left out."""
    out = {}
    for name, value in ct2.variables.items():
        if value.ndim == 0 or name.endswith("_scale") or value.dtype == np.int8 and value.ndim == 1:
            continue  # attributes, scales, strings
        out[name] = ct2.weight(name)
    return out


def split_rows(parts: int, index: int):
    def take(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(parts, dim=0)[index].contiguous()
    return take


def map_linear(m: Mapper, sd: dict[str, torch.Tensor], ours: str, theirs: str, parts: int = 1, index: int = 0) -> None:
    """A CTranslate2 linear (or one of `parts` fused in its rows) onto one of ours; a missing bias is zeros."""
    take = split_rows(parts, index) if parts > 1 else None
    m.put(f"{ours}.weight", f"{theirs}/weight", take)
    if f"{theirs}/bias" in sd:
        m.put(f"{ours}.bias", f"{theirs}/bias", take)
    else:
        m.tensors[f"{ours}.bias"] = torch.zeros(sd[f"{theirs}/weight"].shape[0] // parts)
        m.sources[f"{ours}.bias"] = f"{theirs}/bias (none: zeros)"


def map_norm(m: Mapper, ours: str, theirs: str) -> None:
    m.put(f"{ours}.weight", f"{theirs}/gamma")
    m.put(f"{ours}.bias", f"{theirs}/beta")


def build_model(ct2: CT2Model, cfg: ModelConfig) -> Transformer:
    sd = ct2_state_dict(ct2)
    m = Mapper(sd, "ctranslate2")
    for side, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            ours, theirs = f"{side}.layers.{i}", f"{side}/layer_{i}"
            for j, name in enumerate(("q_proj", "k_proj", "v_proj")):  # linear_0: Q, K and V in its rows
                map_linear(m, sd, f"{ours}.self_attn.{name}", f"{theirs}/self_attention/linear_0", 3, j)
            map_linear(m, sd, f"{ours}.self_attn.out_proj", f"{theirs}/self_attention/linear_1")
            map_norm(m, f"{ours}.self_attn_norm", f"{theirs}/self_attention/layer_norm")
            if side == "decoder":
                map_linear(m, sd, f"{ours}.cross_attn.q_proj", f"{theirs}/attention/linear_0")
                map_linear(m, sd, f"{ours}.cross_attn.k_proj", f"{theirs}/attention/linear_1", 2, 0)  # K and V
                map_linear(m, sd, f"{ours}.cross_attn.v_proj", f"{theirs}/attention/linear_1", 2, 1)
                map_linear(m, sd, f"{ours}.cross_attn.out_proj", f"{theirs}/attention/linear_2")
                map_norm(m, f"{ours}.cross_attn_norm", f"{theirs}/attention/layer_norm")
            map_linear(m, sd, f"{ours}.ffn.w_1", f"{theirs}/ffn/linear_0")
            map_linear(m, sd, f"{ours}.ffn.w_2", f"{theirs}/ffn/linear_1")
            map_norm(m, f"{ours}.ffn_norm", f"{theirs}/ffn/layer_norm")
        if getattr(cfg, f"{side}_final_norm"):
            map_norm(m, f"{side}.final_norm", f"{side}/layer_norm")
        if cfg.embed_norm:
            map_norm(m, f"{side}.embed_norm", f"{side}/layernorm_embedding")
    src_key, tgt_key = embedding_key(ct2, "encoder"), embedding_key(ct2, "decoder")
    m.put("src_embed.weight", src_key)
    if cfg.share_embeddings:
        m.used.add(tgt_key)
    else:
        m.put("tgt_embed.weight", tgt_key)
    if cfg.tie_generator:
        m.used.add("decoder/projection/weight")
    else:
        m.put("generator.weight", "decoder/projection/weight")
    if "decoder/projection/bias" in sd:
        m.put("generator.bias", "decoder/projection/bias")
    else:
        m.tensors["generator.bias"] = torch.zeros(cfg.tgt_vocab_size)
        m.sources["generator.bias"] = "decoder/projection/bias (none: zeros)"
    positions = None
    if cfg.positions == "learned":  # stored tables, one per stack
        m.put("pos_table", "encoder/position_encodings/encodings", lambda t: t[: cfg.max_positions])
        m.put("decoder_pos_table", "decoder/position_encodings/encodings", lambda t: t[: cfg.max_positions])
    else:  # CTranslate2's computed sinusoid
        positions = position_table(cfg)
    return m.build(cfg, positions)


def vocabulary_table(tokens: list[str]) -> bytes:
    """A {token: id} JSON table of a CTranslate2 vocabulary (a repeated token keeps its first id, as
    vocabulary.cc's map does)."""
    table: dict[str, int] = {}
    for i, token in enumerate(tokens):
        table.setdefault(token, i)
    return json.dumps(table, ensure_ascii=False).encode()


# --- import ---

# SentencePiece models a CTranslate2 directory may hold beside its model (Argos packages' is one level up):
# one for both sides, or one a side as Marian's conversions keep them.
BPE_CODES = "bpe.codes"
SHARED_SPM = ("sentencepiece.model", "spm.model", "sentencepiece.bpe.model")
SIDE_SPM = (("source.spm", "target.spm"), ("spm.src.model", "spm.tgt.model"))
DEFAULT_MAX_POSITIONS = 1024  # computed sinusoid: CTranslate2 has no limit; its max_input_length is 1024


@dataclass
class CT2Import:
    """What an import of a CTranslate2 model needs beside the model directory: its SentencePiece model(s) or its
    BPE codes, and what a package adds (languages, decoding defaults, detokenization, where it came from)."""

    source_spm: Path | zipfile.Path | None = None  # None: bpe_codes
    target_spm: Path | zipfile.Path | None = None  # None: the source's
    bpe_codes: Path | zipfile.Path | None = None  # subword-nmt's codes after Moses tokenization (kind moses-bpe)
    moses: tuple[str, str] | None = None  # with bpe_codes: the (source, target) languages of Moses' rules
    languages: Languages = field(default_factory=lambda: Languages())
    target_prefix: str | None = None  # a token forced after the decoder's start (multilingual Argos packages)
    decoding: dict[str, Any] = field(default_factory=dict)
    detokenize: str = "sentencepiece"
    imported_from: dict[str, Any] = field(default_factory=dict)


def find_spm(directory: Path | zipfile.Path, spm: Path | None = None, target_spm: Path | None = None) -> CT2Import:
    """The SentencePiece model(s) named, else found in the directory."""
    if spm is not None:
        return CT2Import(source_spm=spm, target_spm=target_spm)
    for name in SHARED_SPM:
        if (directory / name).is_file():
            return CT2Import(source_spm=directory / name)
    for source, target in SIDE_SPM:
        if (directory / source).is_file() and (directory / target).is_file():
            return CT2Import(source_spm=directory / source, target_spm=directory / target)
    raise BadCheckpoint(f"{directory}: no SentencePiece model beside the CTranslate2 model ({', '.join(SHARED_SPM)}, "
                        "or source.spm and target.spm); name it with --tokenizer (and --target-tokenizer where the "
                        "target has its own)")


def import_ct2(ct2: CT2Model, how: CT2Import, max_positions: int = DEFAULT_MAX_POSITIONS) -> Imported:
    """A TransformerSpec model and its tokenizer, as a twostep model and tokenizer section."""
    if ct2.config.get("add_source_bos"):
        raise BadCheckpoint(f"{ct2.path}: config.json has add_source_bos; twostep puts no token before a source "
                            "sentence of a CTranslate2 model")
    cfg, ids = ct2_config(ct2, max_positions)
    languages = how.languages
    if how.target_prefix:
        target = {t: i for i, t in reversed(list(enumerate(ct2.target_vocab)))}
        if how.target_prefix not in target:
            raise BadCheckpoint(f"{ct2.path}: the target prefix {how.target_prefix!r} is not in the target vocabulary")
        languages = Languages(languages.source, {code: TargetLanguage(decoder=(target[how.target_prefix],))
                                                 for code in languages.target},
                              languages.default_source, languages.default_target)
    model = build_model(ct2, cfg)
    source_model, kind = (SOURCE_SPM, "sentencepiece") if how.bpe_codes is None else (BPE_CODES, "moses-bpe")
    files: dict[str, Path | bytes] = {source_model: read_bytes(how.source_spm if how.bpe_codes is None
                                                               else how.bpe_codes),
                                      SOURCE_VOCAB: vocabulary_table(ct2.source_vocab)}
    target_spm, target_vocab = source_model, SOURCE_VOCAB
    if how.target_spm is not None:
        files[TARGET_SPM], target_spm = read_bytes(how.target_spm), TARGET_SPM
    if not ct2.shared_vocab:
        files[TARGET_VOCAB], target_vocab = vocabulary_table(ct2.target_vocab), TARGET_VOCAB
    specials = {ids["eos"], ids["bos"], ids["start"], ids["pad"], ids["unk"]}
    spec = TokenizerSpec(
        kind=kind, moses=how.moses if how.bpe_codes is not None else None,
        source_model=source_model, target_model=target_spm, source_vocab=SOURCE_VOCAB, target_vocab=target_vocab,
        source_suffix=(source_id(ct2, ct2.config["eos_token"]),) if ct2.config.get("add_source_eos") else (),
        drop_ids=tuple(sorted(specials | {i for code in languages.target for i in languages.target[code].decoder})),
        unk_id=source_id(ct2, ct2.config["unk_token"]), languages=languages, detokenize=how.detokenize)
    notes = []
    if (ct2.path / "vmap.txt").is_file():
        notes.append("vmap.txt (a vocabulary map CTranslate2 uses with use_vmap) is not used: twostep scores the "
                     "whole target vocabulary")
    return Imported(model, spec, files, notes, family="ctranslate2")


def source_id(ct2: CT2Model, token: str) -> int:
    if token not in ct2.source_vocab:
        raise BadCheckpoint(f"{ct2.path}: the token {token!r} is not in the source vocabulary")
    return ct2.source_vocab.index(token)


def read_bytes(path: Path | zipfile.Path) -> bytes:
    try:
        return path.read_bytes()
    except (OSError, zipfile.BadZipFile) as exc:
        raise BadCheckpoint(f"{path}: cannot read it ({exc})") from None
