"""Marian (MarianMTModel: OPUS-MT): post-norm, no final norms, Marian's sinusoid, `final_logits_bias` as the
generator's bias, the decoder starting from pad, two SentencePiece models and `vocab.json` (a separate
`target_vocab.json` where the vocabularies are not shared); multilingual models' `>>fra<<` tokens, which go
before the source, are its target languages. `tokenizer_config.json`'s source_lang and target_lang (as
MarianTokenizer saves them) name a bilingual model's pair, and a multi-target model's source; a hub name's pair
(opus-mt-en-de) is not trusted, nor a code that names no one language (OPUS-MT's mul, ROMANCE)."""

from __future__ import annotations

from pathlib import Path

from twostep.artifact.config import ModelConfig
from twostep.artifact.tokenizer import Languages, TargetLanguage, TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.model.hf.common import (
    SOURCE_SPM,
    SOURCE_VOCAB,
    TARGET_SPM,
    TARGET_VOCAB,
    HFModel,
    Imported,
    biased_generator,
    check_vocab,
    common_config,
    embeddings,
    family,
    generator_tied,
    layers,
    named_pair,
    notes,
    read_vocab,
    refuse_unsupported,
)
from twostep.model.importers import Mapper
from twostep.model.transformer import position_table


@family("marian")
def import_marian(hf: HFModel) -> Imported:
    refuse_unsupported(hf, {"normalize_before": bool, "normalize_embedding": bool, "add_final_layer_norm": bool,
                            "static_position_embeddings": lambda v: v is False})
    sd = hf.state_dict()
    shared = bool(hf.get("share_encoder_decoder_embeddings", True))
    m = Mapper(sd, "marian")
    src_key, tgt_key = embeddings(m, sd, shared)
    src_vocab = m.shape(src_key)[0]
    tgt_vocab = m.shape(tgt_key)[0]
    tied = generator_tied(sd, tgt_key)

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
    biased_generator(m, tied)
    positions = position_table(cfg)
    if "encoder.embed_positions.weight" in sd:  # saved by older transformers: what they decode with
        positions = m.positions("encoder.embed_positions.weight", cfg)
        m.used.add("decoder.embed_positions.weight")
    model = m.build(cfg, positions)

    codes = {piece[2:-2]: i for piece, i in vocab.items() if piece.startswith(">>") and piece.endswith("<<")}
    languages = Languages(target={c: TargetLanguage(source=(i,)) for c, i in codes.items()} if shared else {})
    languages = named_pair(hf, languages)
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
