"""T5 (T5ForConditionalGeneration; model_type t5 and mt5): T5 v1.0 (relu, the output layer tied to the shared
embedding and fed the decoder's output times d_model ** -0.5) and v1.1, mT5 and MADLAD-400 (gated-gelu, an output
layer of its own), as config features of twostep's model: RMS norms without bias, attention without the 1/sqrt(d)
scale, the relative attention bias (one table per stack, in its first layer), no position embeddings, no embedding
scale, the decoder starting from pad.

The tokenizer: `spiece.model` (transformers' T5Tokenizer numbers its pieces, then the extra ids <extra_id_N-1> ..
<extra_id_0>), or `tokenizer.json`, whose ids are transformers' own; with both (the hub's layout) SentencePiece
splits text, as the C++ library can too, and tokenizer.json numbers it. The embedding may have more rows than the
tokenizer has ids (T5 pads its 32,100 to 32,128), never fewer.

MADLAD-400's target language is a `<2xx>` piece put before the source text (`<2de> Hello`), not forced on the
decoder. Its tokenizer splits that text as any other: "▁" then "<2de>" (a piece of the vocabulary, not a token
split out of the text first), and the words after it as they would be alone. So a language's tokens are those its
tokenizer gives "<2de>" alone, recorded as the languages' `source` tokens (Marian's >>fra<< is one), which every
consumer puts before the source pieces; MADLAD reads any of its languages, so each is a source language too,
which adds no token. A T5 without `<2xx>` pieces (an English-German fine-tune) is one pair, which
tokenizer_config.json or `twostep import --src-lang/--tgt-lang` names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twostep.artifact.config import ModelConfig
from twostep.artifact.tokenizer import Languages, TargetLanguage, TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.model.hf.common import (
    ACTIVATIONS,
    SOURCE_SPM,
    SOURCE_VOCAB,
    TOKENIZER_JSON,
    CodedIds,
    HFModel,
    Imported,
    TokenizerJson,
    embeddings,
    family,
    generator_tied,
    named_pair,
    notes,
    tokenizer_config,
)
from twostep.model.importers import Mapper
from twostep.model.transformer import position_table

SPIECE = "spiece.model"
TARGET_TOKEN = re.compile(r"<2([A-Za-z]{2,3}(?:[_-][A-Za-z0-9]+)*)>")  # MADLAD's <2de>, <2zh_Latn>


def feed_forward(hf: HFModel) -> tuple[str, bool]:
    """config.json's feed_forward_proj ("relu", "gated-gelu", ...) as (twostep's activation, gated), as
    transformers' T5Config reads it: "gated-gelu" means gelu_new (the tanh approximation)."""
    proj = hf.get("feed_forward_proj", "relu")
    parts = proj.split("-") if isinstance(proj, str) else []
    gated = len(parts) == 2 and parts[0] == "gated"
    name = "gelu_new" if proj == "gated-gelu" else (parts[-1] if parts else None)
    if not (len(parts) == 1 or gated) or name not in ACTIVATIONS:
        raise BadCheckpoint(f"{hf.path / 'config.json'}: feed_forward_proj {proj!r} is not one twostep runs: "
                            f"{', '.join(ACTIVATIONS)}, each alone or gated (gated-gelu)")
    return ACTIVATIONS[name], gated


def scaled_output(hf: HFModel, model_type: str) -> bool:
    """Whether the decoder's output is multiplied by d_model ** -0.5 before the output layer, as transformers
    decides it: T5 where config.json says scale_decoder_outputs (transformers 5 writes it), else where it does not
    say tie_word_embeddings false (T5 v1.0's tied embedding); mT5 never."""
    if model_type == "mt5":
        return False
    if "scale_decoder_outputs" in hf.config:
        return bool(hf.get("scale_decoder_outputs"))
    return hf.get("tie_word_embeddings", True) is not False


def spiece_ids(path: Path, extra_ids: int) -> CodedIds:
    """The ids transformers' T5Tokenizer gives a SentencePiece model's pieces: its own ids, then the extra ids
    in reverse (<extra_id_0> is the last)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError, and whatever a truncated file raises
        raise BadCheckpoint(f"{path}: not a SentencePiece model ({exc})") from None
    if not proto.pieces:
        raise BadCheckpoint(f"{path}: not a SentencePiece model (no pieces)")
    table = {p.piece: i for i, p in enumerate(proto.pieces)}
    extras = {f"<extra_id_{k}>": len(proto.pieces) + extra_ids - 1 - k for k in range(extra_ids)}
    table.update(extras)
    specials = {p: table[p] for p in ("<pad>", "</s>", "<unk>") if p in table} | extras
    return CodedIds(path, table, specials)


def splitter(hf: HFModel, table: dict[str, int]) -> Callable[[str], tuple[int, ...]]:
    """Text to ids as the model's tokenizer splits it: SentencePiece where the directory has spiece.model (its
    pieces numbered by `table`), else tokenizer.json through the tokenizers library; no eos."""
    if (hf.path / SPIECE).is_file():
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(hf.path / SPIECE))
        unk = table.get("<unk>", 2)
        return lambda text: tuple(table.get(p, unk) for p in sp.encode(text, out_type=str))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(hf.path / TOKENIZER_JSON))
    return lambda text: tuple(tokenizer.encode(text, add_special_tokens=False).ids)


def t5_tokenizer(hf: HFModel, rows: int) -> tuple[TokenizerSpec, dict[str, Path | bytes], dict[str, int]]:
    """The tokenizer section, its files, and the ids of pad, eos and unk."""
    spm, tj = hf.path / SPIECE, hf.path / TOKENIZER_JSON
    tok = tokenizer_config(hf)
    if tj.is_file():
        read = TokenizerJson.read(tj)
        ids = read.ids()
        dropped = {piece: i for piece, i in ids.added.items() if piece in read.special}
    elif spm.is_file():
        extra = tok.get("extra_ids", 100)
        if not isinstance(extra, int) or isinstance(extra, bool) or extra < 0:
            raise BadCheckpoint(f"{hf.path / 'tokenizer_config.json'}: extra_ids {extra!r} is not a count")
        ids = spiece_ids(spm, extra)
        dropped = dict(ids.added)
    else:
        raise BadCheckpoint(f"{hf.path}: no tokenizer files; a T5 model needs {SPIECE} or {TOKENIZER_JSON}: save the "
                            "tokenizer with the model (tokenizer.save_pretrained)")
    ids.check_rows(rows)
    special_ids = {piece: ids.id_of(piece) for piece in ("</s>", "<unk>")}
    special_ids["<pad>"] = ids.table.get("<pad>", hf.get("pad_token_id", 0))
    codes = [m.group(1) for piece in ids.table if (m := TARGET_TOKEN.fullmatch(piece))]
    if codes:
        split = splitter(hf, ids.table)
        languages = Languages(source={code: () for code in codes},
                              target={code: TargetLanguage(source=split(f"<2{code}>")) for code in codes})
    else:
        languages = named_pair(hf, Languages())
    drop = tuple(sorted({*special_ids.values(), *dropped.values()}))
    common: dict[str, Any] = dict(source_suffix=(special_ids["</s>"],), unk_id=special_ids["<unk>"],
                                  languages=languages, drop_ids=drop)
    if spm.is_file():
        spec = TokenizerSpec(source_model=SOURCE_SPM, target_model=SOURCE_SPM, source_vocab=SOURCE_VOCAB,
                             target_vocab=SOURCE_VOCAB, special_pieces=tuple(ids.added), **common)
        files: dict[str, Path | bytes] = {SOURCE_SPM: spm,
                                          SOURCE_VOCAB: json.dumps(ids.table, ensure_ascii=False).encode()}
    else:
        spec = TokenizerSpec(source_model=TOKENIZER_JSON, target_model=TOKENIZER_JSON, kind="tokenizers", **common)
        files = {TOKENIZER_JSON: tj}
    return spec, files, special_ids


def import_t5(hf: HFModel, model_type: str) -> Imported:
    sd = hf.state_dict()
    m = Mapper(sd, model_type)
    src_key, _ = embeddings(m, sd, True)
    rows = m.shape(src_key)[0]
    spec, files, special = t5_tokenizer(hf, rows)
    activation, gated = feed_forward(hf)
    tied = generator_tied(sd, src_key)
    d_model = hf.get("d_model")
    if not isinstance(d_model, int) or isinstance(d_model, bool) or d_model <= 0:  # read before the config checks it
        raise BadCheckpoint(f"{hf.path / 'config.json'}: d_model {d_model!r} is not a size")
    layers = hf.get("num_layers")
    config = dict(
        src_vocab_size=rows, tgt_vocab_size=rows, d_model=d_model, n_heads=hf.get("num_heads"),
        d_k=hf.get("d_kv"), d_v=hf.get("d_kv"), d_ff=hf.get("d_ff"), n_encoder_layers=layers,
        n_decoder_layers=hf.get("num_decoder_layers") or layers, max_positions=hf.get("n_positions") or 512,
        dropout=0.0, norm_placement="pre", norm_type="rms", norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        attn_bias=False, generator_bias=False, scale_embedding=False, scale_attention=False, ffn_bias=False,
        gated_ffn=gated, activation=activation, positions="none",
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        share_embeddings=True, tie_generator=tied,
        logit_scale=d_model ** -0.5 if scaled_output(hf, model_type) else 1.0,
        pad_id=special["<pad>"], eos_id=special["</s>"], unk_id=special["<unk>"],
        bos_id=hf.get("decoder_start_token_id", special["<pad>"]),
        decoder_start_id=hf.get("decoder_start_token_id", special["<pad>"]),
    )
    cfg = ModelConfig(**config)
    for side, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            ours, theirs = f"{side}.layers.{i}", f"{side}.block.{i}.layer"
            sublayers = [("self_attn", "SelfAttention")] + ([("cross_attn", "EncDecAttention")] if side == "decoder"
                                                            else [])
            for k, (attn, their_attn) in enumerate(sublayers):
                for name, their_name in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
                    m.linear(f"{ours}.{attn}.{name}", f"{theirs}.{k}.{their_attn}.{their_name}", bias=False)
                m.put(f"{ours}.{attn}_norm.weight", f"{theirs}.{k}.layer_norm.weight")
            ffn = f"{theirs}.{len(sublayers)}"
            names = (("w_1", "wi_0"), ("w_3", "wi_1"), ("w_2", "wo")) if gated else (("w_1", "wi"), ("w_2", "wo"))
            for name, their_name in names:
                m.linear(f"{ours}.ffn.{name}", f"{ffn}.DenseReluDense.{their_name}", bias=False)
            m.put(f"{ours}.ffn_norm.weight", f"{ffn}.layer_norm.weight")
        m.put(f"{side}.final_norm.weight", f"{side}.final_layer_norm.weight")
        m.put(f"{side}.relative_bias.weight", f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
    m.used.add("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")  # transformers ignores it
    m.put("src_embed.weight", src_key)
    if tied:
        m.used.add("lm_head.weight")
    else:
        m.put("generator.weight", "lm_head.weight")
    model = m.build(cfg, position_table(cfg))
    return Imported(model, spec, files, notes(hf), family=model_type)


@family("t5")
def import_t5_family(hf: HFModel) -> Imported:
    return import_t5(hf, "t5")


@family("mt5")
def import_mt5(hf: HFModel) -> Imported:
    return import_t5(hf, "mt5")
