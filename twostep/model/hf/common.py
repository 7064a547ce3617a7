"""What every transformers family's importer shares: the model directory read (config.json, generation config,
safetensors weights), the sizes and layer names of transformers' BART-family models (Marian, M2M100, NLLB, mBART
alike), the tokenizer files' tables, and the registry of families keyed by config.json's model_type.

A family is a module of this package (marian.py, m2m100.py, nllb.py, mbart.py) whose importer, registered with
`@family("model_type")`, resolves everything the family needs into the model config and the tokenizer section
(twostep.artifact.tokenizer): the graphs and the runtime know no family. What the config cannot represent is
refused with one line that names it; every tensor is mapped with the importers' Mapper, all problems in one
error. `generation_config.json`'s `bad_words_ids` of one token become ids the decoder never generates (OPUS-MT's
pad), its `forced_bos_token_id` the default target language, and its decoding settings the decoding defaults the
checkpoint records (`generation_decoding`): a model decodes as transformers' generate() does, or is refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from twostep.artifact.config import ModelConfig
from twostep.artifact.tokenizer import Languages, TargetLanguage, TokenizerSpec, is_language_code
from twostep.errors import BadCheckpoint
from twostep.files import read_json
from twostep.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from twostep.model.importers import Mapper, read_state_dict, same
from twostep.model.transformer import Transformer

StateDict = dict[str, torch.Tensor]

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "swish": "silu", "silu": "silu"}

# The names an imported checkpoint (and its artifact) gives the tokenizer's files.
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
SOURCE_VOCAB, TARGET_VOCAB = "source_vocab.json", "target_vocab.json"
TOKENIZER_JSON = "tokenizer.json"


@dataclass
class Imported:
    """A family importer's answer: the model, its tokenizer section, and the files it names (path or bytes)."""

    model: Transformer
    tokenizer: TokenizerSpec
    files: dict[str, Path | bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    family: str | None = None  # where it is not the name it was imported by (NLLB, found under m2m_100)
    decoding: dict[str, Any] = field(default_factory=dict)  # decoding defaults the artifact records (Argos')
    source: dict[str, Any] = field(default_factory=dict)  # more of where it came from (an Argos package's metadata)


def save_imported(imported: Imported, directory: Path, out_dir: Path, force: bool = False) -> Checkpoint:
    """An import saved as a twostep checkpoint at out_dir; `directory`: where it was read from."""
    info = {"imported_from": {"format": imported.family, "directory": str(directory), "notes": imported.notes,
                              **imported.source},
            "tokenizer": imported.tokenizer.to_json()}
    if imported.decoding:
        info["decoding"] = imported.decoding
    path = save_checkpoint(imported.model, out_dir, info=info, force=force, tokenizer_files=imported.files)
    return load_checkpoint(path)  # as written: float32, memory-mapped (a bf16 model was widened as it was written)


class HFModel:
    """A transformers model directory, read: its config, generation config and state dict (keys without the
    `model.` prefix)."""

    def __init__(self, path: Path):
        self.path = path
        if not path.is_dir():
            raise BadCheckpoint(f"{path}: not a directory; `twostep import DIR` reads a transformers model "
                                "directory (config.json, model.safetensors, tokenizer files)")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise BadCheckpoint(f"{path}: no config.json; is this a transformers model directory?")
        self.config = read_json(config_file, BadCheckpoint)
        if not isinstance(self.config, dict):
            raise BadCheckpoint(f"{config_file}: expected a JSON object")
        generation = path / "generation_config.json"
        # transformers reads generation_config.json where the directory has one, else config.json's settings
        self.generation = read_json(generation, BadCheckpoint) if generation.is_file() else self.config
        if not isinstance(self.generation, dict):
            raise BadCheckpoint(f"{generation}: expected a JSON object")

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def generation_value(self, key: str) -> Any:
        """A generation setting as generate() reads it: generation_config.json's where the directory has one, else
        (older exports) config.json's; None: not set."""
        return self.generation.get(key)

    def state_dict(self) -> StateDict:
        sd = self.read_weights()
        return {k.removeprefix("model."): v for k, v in sd.items()}

    def read_weights(self) -> StateDict:
        single, index = self.path / "model.safetensors", self.path / "model.safetensors.index.json"
        if single.is_file():
            return read_safetensors(single)
        if index.is_file():  # sharded: every shard memory-mapped, none read whole
            weight_map = read_json(index, BadCheckpoint).get("weight_map", {})
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise BadCheckpoint(f"{index}: expected a weight_map object of tensor name -> shard file")
            shards = sorted(set(weight_map.values()))
            missing = [shard for shard in shards if not (self.path / shard).is_file()]
            if missing:
                raise BadCheckpoint(f"{self.path}: {', '.join(missing)} missing ({index.name} names {len(shards)} "
                                    "shards); copy every shard of the model")
            sd: StateDict = {}
            for shard in shards:
                sd.update(read_safetensors(self.path / shard))
            absent = sorted(name for name, shard in weight_map.items() if name not in sd)
            if absent:
                raise BadCheckpoint(f"{index}: names {len(absent)} tensor(s) its shards lack ({', '.join(absent[:3])}"
                                    f"{', ...' if len(absent) > 3 else ''}); the shards are not this index's")
            return sd
        if (self.path / "pytorch_model.bin").is_file():
            return read_state_dict(self.path / "pytorch_model.bin")  # weights_only=True
        raise BadCheckpoint(f"{self.path}: no weights (model.safetensors, model.safetensors.index.json or "
                            "pytorch_model.bin)")

    def file(self, name: str, what: str) -> Path:
        path = self.path / name
        if not path.is_file():
            raise BadCheckpoint(f"{self.path}: missing {name} ({what}); copy the model's tokenizer files with it")
        return path

    def never_generate(self) -> tuple[int, ...]:
        """generation_config's bad_words_ids of one token each: ids transformers never generates."""
        bad = self.generation_value("bad_words_ids") or []
        return tuple(sorted({ids[0] for ids in bad if isinstance(ids, list) and len(ids) == 1}))


# generate()'s early_stopping -> the beam search rule that decodes as it does (DecodeOptions' beam_stop)
EARLY_STOPPING = {False: "transformers", True: "transformers_early", "never": "transformers_never"}
# Generation settings that change what generate() decodes and that twostep does not run: each with the values that
# change nothing (unset, None, is one of them) and what it asks for.
NOT_RUN = {
    "do_sample": ((False,), "sampling; twostep samples only when asked (--sample)"),
    "min_length": ((0, 1), "eos blocked after the softmax (twostep's min_new_tokens blocks it before)"),
    "min_new_tokens": ((0,), "eos blocked after the softmax (twostep's min_new_tokens blocks it before)"),
    "repetition_penalty": ((1, 1.0), "a repetition penalty"),
    "encoder_repetition_penalty": ((1, 1.0), "an encoder repetition penalty"),
    "encoder_no_repeat_ngram_size": ((0,), "n-grams of the source banned"),
    "num_beam_groups": ((1,), "diverse (group) beam search"),
    "diversity_penalty": ((0, 0.0), "diverse (group) beam search"),
    "penalty_alpha": ((0, 0.0), "contrastive search"),
    "exponential_decay_length_penalty": ((), "an exponentially growing eos bonus"),
    "renormalize_logits": ((False,), "log-probabilities renormalised after the bans"),
    "sequence_bias": (({},), "biased token sequences"),
    "force_words_ids": (([],), "constrained beam search"),
    "constraints": (([],), "constrained beam search"),
    "suppress_tokens": (([],), "suppressed tokens"),
    "begin_suppress_tokens": (([],), "tokens suppressed at the first step"),
    "forced_decoder_ids": (([],), "forced decoder ids"),
    "guidance_scale": ((1, 1.0), "classifier-free guidance"),
    "watermarking_config": (({},), "watermarking"),
}


def generation_decoding(hf: HFModel) -> dict[str, Any]:
    """generate()'s decoding as the model's generation config sets it, as the decoding defaults a checkpoint records
    (DecodeOptions' fields): transformers' beam search rule for its early_stopping (beam_stop), num_beams
    (beam_size), length_penalty, max_new_tokens (else max_length, which counts the decoder's start token: one
    less), no_repeat_ngram_size. A setting that changes what generate() decodes and that twostep does not run
    (NOT_RUN, bad_words_ids of several tokens) or a value generate() does not take is refused: every one in one
    line, with the fix. Without max_length generate() stops at 20 new tokens; twostep keeps its own default (2 x
    source + 16)."""
    value = hf.generation_value
    where = "generation_config.json" if (hf.path / "generation_config.json").is_file() else "config.json"
    problems = [f"{key} {json.dumps(value(key))} ({what})" for key, (same, what) in NOT_RUN.items()
                if value(key) is not None and value(key) not in same]
    bad_words = value("bad_words_ids") or []
    bad_words = [ids for ids in bad_words if not (isinstance(ids, list) and len(ids) == 1)] \
        if isinstance(bad_words, list) else [bad_words]
    if bad_words:
        problems.append(f"bad_words_ids {json.dumps(bad_words)} (sequences of several tokens banned; twostep bans "
                        "single tokens)")

    def count(key: str, low: int) -> int | None:
        found = value(key)
        if found is not None and (not isinstance(found, int) or isinstance(found, bool) or found < low):
            problems.append(f"{key} {json.dumps(found)} (expected an integer of at least {low})")
        return found
    beams, new_tokens, max_length = count("num_beams", 1), count("max_new_tokens", 1), count("max_length", 2)
    ngram, early, length_penalty = count("no_repeat_ngram_size", 0), value("early_stopping"), value("length_penalty")
    if early is not None and not (isinstance(early, bool) or early == "never"):
        problems.append(f"early_stopping {json.dumps(early)} (expected true, false or \"never\")")
    if length_penalty is not None and (not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool)
                                       or not math.isfinite(length_penalty)):
        problems.append(f"length_penalty {json.dumps(length_penalty)} (expected a number)")
    if problems:
        them = "it" if len(problems) == 1 else "them"
        raise BadCheckpoint(f"{hf.path / where}: cannot import generate()'s decoding: {'; '.join(problems)}; twostep "
                            f"does not decode so: remove {them} from {where} to import the model, which then "
                            f"decodes as generate() does without {them}")
    decoding: dict[str, Any] = {"beam_stop": EARLY_STOPPING[early if early is not None else False]}
    if beams is not None:
        decoding["beam_size"] = beams
    if length_penalty is not None:
        decoding["length_penalty"] = float(length_penalty)
    if new_tokens is not None or max_length is not None:
        decoding["max_new_tokens"] = new_tokens if new_tokens is not None else max_length - 1
    if ngram:
        decoding["no_repeat_ngram_size"] = ngram
    return decoding


def read_safetensors(path: Path) -> StateDict:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise BadCheckpoint(f"{path}: cannot read safetensors ({exc})") from None


def read_vocab(path: Path) -> dict[str, int]:
    table = read_json(path, BadCheckpoint)
    if not isinstance(table, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in table.values()):
        raise BadCheckpoint(f"{path}: expected a JSON object of piece -> integer id")
    return table


def check_vocab(name: str, table: dict[str, int], rows: int, embedding: str, extra: int = 0) -> None:
    """A vocabulary must number exactly the embedding's rows (less `extra` ids it does not list)."""
    top = max(table.values(), default=-1)
    if len(table) + extra != rows or top >= rows:
        raise BadCheckpoint(f"{name} has {len(table)} entries{f' (+{extra} reserved ids)' if extra else ''}, ids up to "
                            f"{top}, but the model's {embedding} has {rows} rows: the tokenizer files do not belong "
                            "to these weights")


def one_value(hf: HFModel, what: str, *keys: str) -> Any:
    """A size the encoder and decoder must agree on (twostep's config holds one)."""
    values = {k: hf.get(k) for k in keys}
    if len(set(values.values())) != 1:
        raise BadCheckpoint(f"cannot import: {what} differ ({', '.join(f'{k} {v}' for k, v in values.items())}); "
                            "twostep's model has one for both stacks")
    return values[keys[0]]


def common_config(hf: HFModel, **values: Any) -> dict[str, Any]:
    """What Marian and M2M100 read alike from config.json."""
    activation = hf.get("activation_function", "relu")
    if activation not in ACTIVATIONS:
        raise BadCheckpoint(f"cannot import: activation_function {activation!r}; twostep supports "
                            f"{', '.join(ACTIVATIONS)}")
    d_model = hf.get("d_model")
    heads = one_value(hf, "attention heads", "encoder_attention_heads", "decoder_attention_heads")
    return dict(
        d_model=d_model, n_heads=heads,
        d_ff=one_value(hf, "feed-forward sizes", "encoder_ffn_dim", "decoder_ffn_dim"),
        n_encoder_layers=hf.get("encoder_layers"), n_decoder_layers=hf.get("decoder_layers"),
        max_positions=hf.get("max_position_embeddings"), dropout=0.0, norm_eps=1e-5,
        scale_embedding=bool(hf.get("scale_embedding", False)), activation=ACTIVATIONS[activation],
        eos_id=hf.get("eos_token_id"), pad_id=hf.get("pad_token_id"),
        decoder_start_id=hf.get("decoder_start_token_id"), never_generate=hf.never_generate(), **values)


def refuse_unsupported(hf: HFModel, unsupported: dict[str, Callable[[Any], bool]]) -> None:
    for key, bad in unsupported.items():
        if key in hf.config and bad(hf.config[key]):
            raise BadCheckpoint(f"cannot import: config.json has {key} = {hf.config[key]!r}, which twostep's "
                                "model does not represent")


def attention(m: Mapper, ours: str, theirs: str) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        m.linear(f"{ours}.{name}", f"{theirs}.{name}")


def layers(m: Mapper, cfg: ModelConfig) -> None:
    """transformers' BART-family layer names, Marian's and M2M100's alike."""
    for side, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            ours = theirs = f"{side}.layers.{i}"
            attention(m, f"{ours}.self_attn", f"{theirs}.self_attn")
            m.norm(f"{ours}.self_attn_norm", f"{theirs}.self_attn_layer_norm")
            if side == "decoder":
                attention(m, f"{ours}.cross_attn", f"{theirs}.encoder_attn")
                m.norm(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm")
            m.linear(f"{ours}.ffn.w_1", f"{theirs}.fc1")
            m.linear(f"{ours}.ffn.w_2", f"{theirs}.fc2")
            m.norm(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm")


def first_present(sd: StateDict, *keys: str) -> str:
    return next((k for k in keys if k in sd), keys[0])


def embeddings(m: Mapper, sd: StateDict, shared: bool) -> tuple[str, str]:
    """The source and target embeddings' keys; tied copies (saved by older transformers) are marked used."""
    if shared:
        src = tgt = first_present(sd, "shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    else:
        src, tgt = "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"
    for key in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if key in sd and key not in (src, tgt) and same(sd, key, src if key != "decoder.embed_tokens.weight" else tgt):
            m.used.add(key)
    return src, tgt


def forced_languages(hf: HFModel, lang_ids: dict[str, int], default_source: str | None,
                     fallback_source: str) -> Languages:
    """Languages as M2M100, NLLB and mBART-50 use them: the source's code first in the source, the target's
    forced after the decoder's start; the default target is generation_config's forced_bos_token_id."""
    forced = hf.generation_value("forced_bos_token_id")
    default_target = next((c for c, i in lang_ids.items() if i == forced), None)
    if default_source not in lang_ids:
        default_source = fallback_source if fallback_source in lang_ids else None
    return Languages(source={c: (i,) for c, i in lang_ids.items()},
                     target={c: TargetLanguage(decoder=(i,)) for c, i in lang_ids.items()},
                     default_source=default_source, default_target=default_target)


def coded_tokenizer(hf: HFModel, rows: int, code: re.Pattern[str], fallback_source: str, what: str,
                    spm_ids: Callable[[Path], CodedIds] | None = None,
                    ) -> tuple[TokenizerSpec, dict[str, Path | bytes], int]:
    """The tokenizer of NLLB and mBART-50: `tokenizer.json` gives every id (pieces, specials, the language codes:
    the added tokens that `code` matches), and the SentencePiece model it was converted from, where the directory
    has it (the hub's layout), splits text, as the C++ library can too; without it (transformers 5 saves
    tokenizer.json alone) the tokenizers library splits it, in Python only. Without tokenizer.json, a family whose
    tokenizer numbers the SentencePiece model's pieces by a rule (`spm_ids`: mBART-50's) reads the ids from that
    model, which must then number the embedding's rows exactly. A source sentence is [src_lang] pieces </s>; the
    target language is forced after the decoder's start. Returns the spec, its files and the unk id."""
    spm = hf.path / "sentencepiece.bpe.model"
    if (hf.path / TOKENIZER_JSON).is_file():
        ids = TokenizerJson.read(hf.path / TOKENIZER_JSON).ids()
        ids.check_rows(rows)
    elif spm_ids is not None and spm.is_file():
        ids = spm_ids(spm)
        check_vocab(f"{spm.name} with {what}'s special tokens and language codes", ids.table, rows, "embedding")
    elif spm_ids is not None:
        raise BadCheckpoint(f"{hf.path}: neither {TOKENIZER_JSON} nor {spm.name} ({what}'s tokenizer, which gives the "
                            "ids of its pieces and language codes); save the tokenizer with the model "
                            "(tokenizer.save_pretrained)")
    else:
        raise BadCheckpoint(f"{hf.path}: missing {TOKENIZER_JSON} ({what}'s tokenizer, which gives the ids of its "
                            "pieces and language codes); save the tokenizer with the model (tokenizer.save_pretrained)")
    tok = tokenizer_config(hf)
    if tok.get("legacy_behaviour"):
        raise BadCheckpoint(f"{hf.path / 'tokenizer_config.json'}: legacy_behaviour is true (the language code after "
                            "</s>); twostep reads the default order, [src_lang] pieces </s>: set it false")
    lang_ids = {piece: i for piece, i in ids.added.items() if code.fullmatch(piece)}
    if not lang_ids:
        raise BadCheckpoint(f"{ids.path}: no language codes among its added tokens; is this {what}'s tokenizer?")
    eos, unk = ids.id_of("</s>"), ids.id_of("<unk>")
    specials = dict(ids.added)
    languages = forced_languages(hf, lang_ids, tok.get("src_lang"), fallback_source)
    drop = tuple(sorted(set(specials.values()) | {hf.get("pad_token_id"), eos, unk}))
    if spm.is_file():
        spec = TokenizerSpec(
            source_model=SOURCE_SPM, target_model=SOURCE_SPM, source_vocab=SOURCE_VOCAB, target_vocab=SOURCE_VOCAB,
            source_suffix=(eos,), unk_id=unk, special_pieces=tuple(specials), languages=languages, drop_ids=drop,
            trailing_space=ids.trailing_space)
        return spec, {SOURCE_SPM: spm, SOURCE_VOCAB: json.dumps(ids.table, ensure_ascii=False).encode()}, unk
    spec = TokenizerSpec(source_model=TOKENIZER_JSON, target_model=TOKENIZER_JSON, kind="tokenizers",
                         source_suffix=(eos,), unk_id=unk, languages=languages, drop_ids=drop)
    return spec, {TOKENIZER_JSON: ids.path}, unk


GENERATOR = "lm_head.weight"


def generator_tied(sd: StateDict, embedding: str) -> bool:
    """Whether the output layer is the target embedding (transformers may save the tied copy, or leave it out)."""
    return GENERATOR not in sd or same(sd, GENERATOR, embedding)


def biased_generator(m: Mapper, tied: bool) -> None:
    """Marian's and mBART's output layer: the embedding or its own weight, `final_logits_bias` as its bias."""
    if tied:
        m.used.add(GENERATOR)
    else:
        m.put("generator.weight", GENERATOR)
    m.put("generator.bias", "final_logits_bias", lambda t: t.reshape(-1))


def notes(hf: HFModel) -> list[str]:
    """What transformers' generate() would do that a twostep decode does not."""
    out = []
    if hf.generation_value("forced_eos_token_id") is not None:
        out.append("forced_eos_token_id (transformers forces eos at max_length) is not applied: twostep stops at "
                   "eos or at max_new_tokens")
    return out


def named_pair(hf: HFModel, languages: Languages) -> Languages:
    """The languages with the pair tokenizer_config.json names: its source_lang, and its target_lang where the
    targets are not the model's tokens."""
    tok = tokenizer_config(hf)
    source, target = tok.get("source_lang"), tok.get("target_lang") if not languages.target else None
    return languages.named(source if is_language_code(source) else None,
                           target if is_language_code(target) else None)


def tokenizer_config(hf: HFModel) -> dict[str, Any]:
    path = hf.path / "tokenizer_config.json"
    config = read_json(path, BadCheckpoint) if path.is_file() else {}
    if not isinstance(config, dict):
        raise BadCheckpoint(f"{path}: expected a JSON object")
    return config


@dataclass(frozen=True)
class CodedIds:
    """A coded tokenizer's ids (NLLB's, mBART-50's): `table` {piece: id} of every piece, specials and language
    codes included, `added` {piece: id} of those alone, `trailing_space` (the manifest's), and the file read."""

    path: Path
    table: dict[str, int]
    added: dict[str, int]
    trailing_space: tuple[int, ...] = ()

    def check_rows(self, rows: int) -> None:
        """Every id must be a row of the embedding (which may have more rows than the tokenizer: NLLB pads it)."""
        top = max(self.table.values(), default=-1)
        if top >= rows:
            raise BadCheckpoint(f"{self.path.name} has ids up to {top}, but the model's embedding has {rows} rows: "
                                "the tokenizer files do not belong to these weights")

    def id_of(self, piece: str) -> int:
        if piece not in self.table:
            raise BadCheckpoint(f"{self.path}: no {piece} token")
        return self.table[piece]


@dataclass(frozen=True)
class TokenizerJson:
    """A Hugging Face `tokenizer.json` (the tokenizers library's file), read for its ids: `table` {piece: id} of
    the model's vocabulary and its added tokens, `added` {content: id} of the added tokens alone (specials,
    language codes). Read with the json module: the tokenizers library itself tokenizes at run time."""

    path: Path
    kind: str  # its model: BPE or Unigram (SentencePiece's two, as transformers converts them)
    table: dict[str, int]
    added: dict[str, int]
    normalizer: dict[str, Any]
    pre_tokenizer: dict[str, Any]
    special: frozenset[str] = frozenset()  # the added tokens marked special (decoded text leaves them out)

    @classmethod
    def read(cls, path: Path) -> TokenizerJson:
        data = read_json(path, BadCheckpoint)
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, dict):
            raise BadCheckpoint(f"{path}: not a tokenizers file (no model object)")
        kind = model.get("type")
        if kind not in ("BPE", "Unigram"):
            raise BadCheckpoint(f"{path}: a {kind} tokenizer; twostep reads the BPE and Unigram tokenizers that "
                                "transformers converts from SentencePiece models (NLLB's, mBART's)")
        vocab = model.get("vocab")
        if kind == "BPE" and isinstance(vocab, dict):
            table = dict(vocab)
        elif kind == "Unigram" and isinstance(vocab, list):
            table = {entry[0]: i for i, entry in enumerate(vocab) if isinstance(entry, list) and entry}
        else:
            raise BadCheckpoint(f"{path}: malformed {kind} vocabulary")
        added = {t["content"]: t["id"] for t in data.get("added_tokens") or []
                 if isinstance(t, dict) and isinstance(t.get("content"), str) and isinstance(t.get("id"), int)}
        table.update(added)
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in table.values()):
            raise BadCheckpoint(f"{path}: ids must be non-negative integers")
        def section(key: str) -> dict[str, Any]:
            value = data.get(key)
            return value if isinstance(value, dict) else {}

        special = frozenset(t["content"] for t in data.get("added_tokens") or []
                            if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str))
        return cls(path, kind, table, added, section("normalizer"), section("pre_tokenizer"), special)

    def ids(self) -> CodedIds:
        return CodedIds(self.path, self.table, self.added, self.trailing_space())

    def trailing_space(self) -> tuple[int, ...]:
        """The ids tokenizers gives whitespace at the end of a stretch of text that SentencePiece drops: the "▁"
        piece where a Metaspace pre-tokenizer follows a normalizer that does not strip the right (NLLB's; mBART-50's
        strips it)."""
        normalizers = [self.normalizer] if self.normalizer.get("type") != "Sequence" else \
            self.normalizer.get("normalizers", [])
        strips = any(n.get("type") == "Strip" and n.get("right", True) for n in normalizers if isinstance(n, dict))
        metaspace = self.pre_tokenizer.get("type") == "Metaspace"
        return (self.table["\u2581"],) if metaspace and not strips and "\u2581" in self.table else ()


Importer = Callable[[HFModel], Imported]
FAMILIES: dict[str, Importer] = {}


def family(name: str) -> Callable[[Importer], Importer]:
    """Register a family's importer under its name (config.json's model_type, or what --format names)."""
    def register(importer: Importer) -> Importer:
        FAMILIES[name] = importer
        return importer
    return register
