"""Pretrained translation models in Hugging Face transformers' format: a model directory (`config.json`, the
weights, the tokenizer's files) in, a twostep checkpoint out. Needs no transformers: the families are read
from their files.

- `marian` (MarianMTModel: OPUS-MT): post-norm, no final norms, Marian's sinusoid, `final_logits_bias` as the
  generator's bias, the decoder starting from pad, two SentencePiece models and `vocab.json` (a separate
  `target_vocab.json` where the vocabularies are not shared); multilingual models' `>>fra<<` tokens, which
  go before the source, are its target languages.
- `m2m_100` (M2M100ForConditionalGeneration): pre-norm with final norms, fairseq's sinusoid offset by pad + 1,
  the decoder starting from eos with the target language's `__fr__` token forced after it, the source starting
  with its language's token; `sentencepiece.bpe.model` and the fairseq-ordered `vocab.json`, the language tokens
  numbered after it (transformers' M2M100Tokenizer).

Everything a family needs is resolved here into the model config and the tokenizer section
(twostep.artifact.tokenizer): the graphs and the runtime know no family. What the config cannot represent is
refused with one line that names it; every tensor is mapped with the importers' Mapper, all problems in one
error. `generation_config.json`'s `bad_words_ids` of one token become ids the decoder never generates (OPUS-MT's
pad), its `forced_bos_token_id` the default target language.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from twostep.artifact.config import ModelConfig
from twostep.artifact.tokenizer import Languages, TargetLanguage, TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.files import read_json
from twostep.model.checkpoint import Checkpoint, save_checkpoint
from twostep.model.importers import Mapper, read_state_dict, same
from twostep.model.transformer import Transformer, position_table

StateDict = dict[str, torch.Tensor]

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "swish": "silu", "silu": "silu"}

# transformers' M2M100Tokenizer numbers these language tokens (__af__, ...) after vocab.json, in this order.
M2M100_LANGUAGES = {
    "m2m100": """
    af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha
    he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne
    nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo
    xh yi yo zh zu""".split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}

# The names an imported checkpoint (and its artifact) gives the tokenizer's files.
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
SOURCE_VOCAB, TARGET_VOCAB = "source_vocab.json", "target_vocab.json"


@dataclass
class Imported:
    """A family importer's answer: the model, its tokenizer section, and the files it names (path or bytes)."""

    model: Transformer
    tokenizer: TokenizerSpec
    files: dict[str, Path | bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


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
        self.generation = read_json(generation, BadCheckpoint) if generation.is_file() else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def generation_value(self, key: str) -> Any:
        """A generation setting: generation_config.json's, else (older exports) config.json's."""
        return self.generation.get(key, self.config.get(key))

    def state_dict(self) -> StateDict:
        sd = self.read_weights()
        return {k.removeprefix("model."): v for k, v in sd.items()}

    def read_weights(self) -> StateDict:
        single, index = self.path / "model.safetensors", self.path / "model.safetensors.index.json"
        if single.is_file():
            return read_safetensors(single)
        if index.is_file():  # sharded
            weight_map = read_json(index, BadCheckpoint).get("weight_map", {})
            sd: StateDict = {}
            for shard in sorted(set(weight_map.values())):
                sd.update(read_safetensors(self.path / shard))
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


def import_marian(hf: HFModel) -> Imported:
    refuse_unsupported(hf, {"normalize_before": bool, "normalize_embedding": bool, "add_final_layer_norm": bool,
                            "static_position_embeddings": lambda v: v is False})
    sd = hf.state_dict()
    shared = bool(hf.get("share_encoder_decoder_embeddings", True))
    m = Mapper(sd, "marian")
    src_key, tgt_key = embeddings(m, sd, shared)
    src_vocab = m.shape(src_key)[0]
    tgt_vocab = m.shape(tgt_key)[0]
    generator = "lm_head.weight"
    tied = generator not in sd or same(sd, generator, tgt_key)

    vocab = read_vocab(hf.file("vocab.json", "the token table of Marian's tokenizer"))
    check_vocab("vocab.json", vocab, src_vocab, "source embedding")
    target_vocab = vocab
    if not shared:
        target_vocab = read_vocab(hf.file("target_vocab.json", "the target token table of a separate-vocabulary "
                                                               "Marian tokenizer"))
        check_vocab("target_vocab.json", target_vocab, tgt_vocab, "target embedding")
    if "<unk>" not in vocab:
        raise BadCheckpoint(f"{hf.path / 'vocab.json'}: no <unk> entry")
    eos = hf.get("eos_token_id")
    cfg = ModelConfig(
        src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, norm_placement="post", positions="marian",
        encoder_final_norm=False, decoder_final_norm=False, share_embeddings=shared, tie_generator=tied,
        unk_id=target_vocab.get("<unk>", vocab["<unk>"]), bos_id=hf.get("decoder_start_token_id"),
        **common_config(hf),
    )
    layers(m, cfg)
    m.put("src_embed.weight", src_key)
    if not shared:
        m.put("tgt_embed.weight", tgt_key)
    if tied:
        m.used.add(generator)
    else:
        m.put("generator.weight", generator)
    m.put("generator.bias", "final_logits_bias", lambda t: t.reshape(-1))
    positions = position_table(cfg)
    if "encoder.embed_positions.weight" in sd:  # saved by older transformers: what they decode with
        positions = m.positions("encoder.embed_positions.weight", cfg)
        m.used.add("decoder.embed_positions.weight")
    model = m.build(cfg, positions)

    codes = {piece[2:-2]: i for piece, i in vocab.items() if piece.startswith(">>") and piece.endswith("<<")}
    languages = Languages(target={c: TargetLanguage(source=(i,)) for c, i in codes.items()} if shared else {})
    specials = [p for p in ("</s>", "<unk>", "<pad>") if p in vocab] + [f">>{c}<<" for c in codes]
    files: dict[str, Path | bytes] = {SOURCE_SPM: hf.file("source.spm", "Marian's source SentencePiece model"),
                                      SOURCE_VOCAB: hf.path / "vocab.json"}
    target_spm = SOURCE_SPM  # transformers decodes a shared vocabulary's output with the source model
    if not shared:
        files[TARGET_SPM] = hf.file("target.spm", "Marian's target SentencePiece model")
        files[TARGET_VOCAB] = hf.path / "target_vocab.json"
        target_spm = TARGET_SPM
    spec = TokenizerSpec(
        source_model=SOURCE_SPM, target_model=target_spm, source_vocab=SOURCE_VOCAB,
        target_vocab=SOURCE_VOCAB if shared else TARGET_VOCAB, source_suffix=(eos,),
        drop_ids=tuple(sorted({eos, cfg.unk_id, cfg.pad_id})), unk_id=vocab["<unk>"],
        special_pieces=tuple(specials), languages=languages)
    return Imported(model, spec, files, notes(hf))


def import_m2m100(hf: HFModel) -> Imported:
    sd = hf.state_dict()
    m = Mapper(sd, "m2m_100")
    src_key, tgt_key = embeddings(m, sd, True)
    vocab_rows = m.shape(src_key)[0]
    tokenizer_config = hf.path / "tokenizer_config.json"
    tok = read_json(tokenizer_config, BadCheckpoint) if tokenizer_config.is_file() else {}
    family = tok.get("language_codes", "m2m100")
    if family not in M2M100_LANGUAGES:
        raise BadCheckpoint(f"{tokenizer_config}: language_codes {family!r}; twostep knows "
                            f"{', '.join(M2M100_LANGUAGES)}")
    codes = M2M100_LANGUAGES[family]
    if "Nllb" in str(tok.get("tokenizer_class", "")) or not (hf.path / "vocab.json").is_file() \
            and (hf.path / "tokenizer.json").is_file():
        raise BadCheckpoint(f"{hf.path}: an NLLB model (M2M100's architecture with NllbTokenizer's tokenizer.json); "
                            "twostep imports M2M100's tokenizer (vocab.json + sentencepiece.bpe.model), not NLLB's yet")
    vocab = read_vocab(hf.file("vocab.json", "the token table of M2M100's tokenizer"))
    madeup = tok.get("num_madeup_words", 8)
    check_vocab("vocab.json", vocab, vocab_rows, "embedding", extra=len(codes) + madeup)
    pad, eos = hf.get("pad_token_id"), hf.get("eos_token_id")
    cfg = ModelConfig(
        src_vocab_size=vocab_rows, tgt_vocab_size=vocab_rows, norm_placement="pre", positions="fairseq",
        position_offset=pad + 1, share_embeddings=True, tie_generator=True, generator_bias=False,
        unk_id=vocab.get("<unk>", 3), bos_id=hf.get("bos_token_id", 0), **common_config(hf),
    )
    layers(m, cfg)
    m.norm("encoder.final_norm", "encoder.layer_norm")
    m.norm("decoder.final_norm", "decoder.layer_norm")
    m.put("src_embed.weight", src_key)
    m.used.add("lm_head.weight")  # tied to the shared embedding
    for key in ("encoder.embed_positions._float_tensor", "decoder.embed_positions._float_tensor",
                "encoder.embed_positions.weights", "decoder.embed_positions.weights"):
        m.used.add(key)  # fairseq's sinusoid, computed, not learned
    model = m.build(cfg, position_table(cfg))

    lang_ids = {code: len(vocab) + i for i, code in enumerate(codes)}
    table = {**vocab, **{f"__{code}__": i for code, i in lang_ids.items()}}
    forced = hf.generation_value("forced_bos_token_id")
    default_target = next((c for c, i in lang_ids.items() if i == forced), None)
    default_source = tok.get("src_lang") or ("en" if "en" in lang_ids else None)
    languages = Languages(source={c: (i,) for c, i in lang_ids.items()},
                          target={c: TargetLanguage(decoder=(i,)) for c, i in lang_ids.items()},
                          default_source=default_source, default_target=default_target)
    specials = [p for p in ("<s>", "</s>", "<pad>", "<unk>") if p in vocab] + [f"__{c}__" for c in codes]
    spec = TokenizerSpec(
        source_model=SOURCE_SPM, target_model=SOURCE_SPM, source_vocab=SOURCE_VOCAB, target_vocab=SOURCE_VOCAB,
        source_suffix=(eos,), unk_id=cfg.unk_id, special_pieces=tuple(specials), languages=languages,
        drop_ids=tuple(sorted({cfg.bos_id, eos, pad, cfg.unk_id, *lang_ids.values()})))
    files = {SOURCE_SPM: hf.file("sentencepiece.bpe.model", "M2M100's SentencePiece model"),
             SOURCE_VOCAB: json.dumps(table, ensure_ascii=False).encode()}
    return Imported(model, spec, files, notes(hf))


def notes(hf: HFModel) -> list[str]:
    """What transformers' generate() would do that a twostep decode does not."""
    out = []
    if hf.generation_value("forced_eos_token_id") is not None:
        out.append("forced_eos_token_id (transformers forces eos at max_length) is not applied: twostep stops at "
                   "eos or at max_new_tokens")
    return out


FAMILIES: dict[str, Callable[[HFModel], Imported]] = {"marian": import_marian, "m2m_100": import_m2m100}


HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
             "pytorch_model.bin", "*.spm", "vocab.json", "target_vocab.json", "sentencepiece.bpe.model",
             "tokenizer_config.json"]


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_name(src: Path | str) -> bool:
    """ORG/NAME that is not a path here: a model of the Hugging Face hub."""
    return (not Path(src).exists() and HUB_NAME.fullmatch(str(src)) is not None
            and Path(src).suffix not in (".pt", ".pth", ".bin", ".ckpt", ".safetensors"))


def download(repo: str) -> Path:
    """A model of the Hugging Face hub (ORG/NAME), downloaded with huggingface_hub (the `hub` extra): only the
    files an import reads."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise BadCheckpoint(f"{repo}: no such directory; to download it from the Hugging Face hub, "
                            "pip install 'twostep[hub]'") from None
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, unknown repository, gated model: huggingface_hub raises many types
        raise BadCheckpoint(f"{repo}: cannot download it from the Hugging Face hub ({str(exc).splitlines()[0]})") \
            from None


def import_hf_directory(src: Path, out_dir: Path, fmt: str | None = None, force: bool = False) -> Checkpoint:
    """Import a transformers model directory (or a hub name ORG/NAME, downloaded); the family is config.json's
    model_type unless `fmt` names it."""
    src = Path(src)
    if is_hub_name(src):
        src = download(str(src))
    hf = HFModel(src)
    family = fmt or hf.get("model_type")
    if family not in FAMILIES:
        raise BadCheckpoint(f"{hf.path / 'config.json'}: model_type {family!r} is not a family twostep imports; it "
                            f"imports {', '.join(FAMILIES)} (--format overrides model_type)")
    imported = FAMILIES[family](hf)
    info = {"imported_from": {"format": family, "directory": str(hf.path), "notes": imported.notes},
            "tokenizer": imported.tokenizer.to_json()}
    path = save_checkpoint(imported.model, out_dir, info=info, force=force, tokenizer_files=imported.files)
    return Checkpoint(path=path, model=imported.model, task=None, info=info)
