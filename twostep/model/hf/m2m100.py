"""M2M100 (M2M100ForConditionalGeneration): pre-norm with final norms, fairseq's sinusoid offset by pad + 1, the
decoder starting from eos with the target language's `__fr__` token forced after it, the source starting with its
language's token; `sentencepiece.bpe.model` and the fairseq-ordered `vocab.json`, the language tokens numbered
after it (transformers' M2M100Tokenizer). NLLB shares the architecture (model_type m2m_100) with its own
tokenizer: such a directory is imported by nllb.py."""

from __future__ import annotations

import json
from pathlib import Path

from twostep.artifact.config import ModelConfig
from twostep.artifact.tokenizer import TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.model.hf.common import (
    FAMILIES,
    SOURCE_SPM,
    SOURCE_VOCAB,
    HFModel,
    Imported,
    check_vocab,
    common_config,
    embeddings,
    family,
    forced_languages,
    layers,
    notes,
    read_vocab,
    tokenizer_config,
)
from twostep.model.importers import Mapper
from twostep.model.transformer import Transformer, position_table

# transformers' M2M100Tokenizer numbers these language tokens (__af__, ...) after vocab.json, in this order.
M2M100_LANGUAGES = {
    "m2m100": """
    af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha
    he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne
    nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo
    xh yi yo zh zu""".split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}


def is_nllb(hf: HFModel) -> bool:
    """NLLB's directories say so in tokenizer_config.json, or hold tokenizer.json without M2M100's vocab.json."""
    tok = tokenizer_config(hf)
    return "Nllb" in str(tok.get("tokenizer_class", "")) or (
        not (hf.path / "vocab.json").is_file() and (hf.path / "tokenizer.json").is_file())


def m2m100_model(hf: HFModel, **ids: int) -> tuple[Transformer, ModelConfig]:
    """M2M100's architecture (NLLB's too), its tensors mapped; `ids`: the special ids its tokenizer gives."""
    sd = hf.state_dict()
    m = Mapper(sd, hf.get("model_type", "m2m_100"))
    src_key, _ = embeddings(m, sd, True)
    rows = m.shape(src_key)[0]
    pad = hf.get("pad_token_id")
    cfg = ModelConfig(
        src_vocab_size=rows, tgt_vocab_size=rows, norm_placement="pre", positions="fairseq",
        position_offset=pad + 1, share_embeddings=True, tie_generator=True, generator_bias=False,
        bos_id=hf.get("bos_token_id", 0), **ids, **common_config(hf),
    )
    layers(m, cfg)
    m.norm("encoder.final_norm", "encoder.layer_norm")
    m.norm("decoder.final_norm", "decoder.layer_norm")
    m.put("src_embed.weight", src_key)
    m.used.add("lm_head.weight")  # tied to the shared embedding
    for key in ("encoder.embed_positions._float_tensor", "decoder.embed_positions._float_tensor",
                "encoder.embed_positions.weights", "decoder.embed_positions.weights"):
        m.used.add(key)  # fairseq's sinusoid, computed, not learned
    return m.build(cfg, position_table(cfg)), cfg


@family("m2m_100")
def import_m2m100(hf: HFModel) -> Imported:
    if not any((hf.path / name).is_file() for name in ("vocab.json", "tokenizer.json", "sentencepiece.bpe.model")):
        raise BadCheckpoint(f"{hf.path}: no tokenizer files; an M2M100 model needs vocab.json and "
                            "sentencepiece.bpe.model, an NLLB model tokenizer.json (and sentencepiece.bpe.model): "
                            "save the tokenizer with the model (tokenizer.save_pretrained)")
    if is_nllb(hf):
        return FAMILIES["nllb"](hf)
    tok = tokenizer_config(hf)
    codes_name = tok.get("language_codes", "m2m100")
    if codes_name not in M2M100_LANGUAGES:
        raise BadCheckpoint(f"{hf.path / 'tokenizer_config.json'}: language_codes {codes_name!r}; twostep knows "
                            f"{', '.join(M2M100_LANGUAGES)}")
    codes = M2M100_LANGUAGES[codes_name]
    vocab = read_vocab(hf.file("vocab.json", "the token table of M2M100's tokenizer"))
    model, cfg = m2m100_model(hf, unk_id=vocab.get("<unk>", 3))
    check_vocab("vocab.json", vocab, cfg.src_vocab_size, "embedding", extra=len(codes) + tok.get("num_madeup_words", 8))

    lang_ids = {code: len(vocab) + i for i, code in enumerate(codes)}
    table = {**vocab, **{f"__{code}__": i for code, i in lang_ids.items()}}
    specials = [p for p in ("<s>", "</s>", "<pad>", "<unk>") if p in vocab] + [f"__{c}__" for c in codes]
    spec = TokenizerSpec(
        source_model=SOURCE_SPM, target_model=SOURCE_SPM, source_vocab=SOURCE_VOCAB, target_vocab=SOURCE_VOCAB,
        source_suffix=(cfg.eos_id,), unk_id=cfg.unk_id, special_pieces=tuple(specials),
        languages=forced_languages(hf, lang_ids, tok.get("src_lang"), "en"),
        drop_ids=tuple(sorted({cfg.bos_id, cfg.eos_id, cfg.pad_id, cfg.unk_id, *lang_ids.values()})))
    files: dict[str, Path | bytes] = {
        SOURCE_SPM: hf.file("sentencepiece.bpe.model", "M2M100's SentencePiece model"),
        SOURCE_VOCAB: json.dumps(table, ensure_ascii=False).encode()}
    return Imported(model, spec, files, notes(hf))
