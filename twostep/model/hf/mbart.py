"""mBART-50 (MBartForConditionalGeneration with MBart50Tokenizer: many-to-many, one-to-many, many-to-one): pre-norm
layers with final norms, a norm after the embedding (`layernorm_embedding`), learned position tables, one per
stack, whose rows start at offset 2, `final_logits_bias` as the generator's bias, codes such as `en_XX`. The
source is [src_lang] pieces </s> as MBart50Tokenizer makes it, the decoder starts from </s> and the target
language is forced after it. The ids come from tokenizer.json where the directory has one, else (the hub's
mbart-large-50-many-to-many-mmt, transformers 4's save_pretrained) from sentencepiece.bpe.model, numbered as
MBart50Tokenizer numbers it. mBART-25 (cc25: MBartTokenizer, the language code after </s>) is refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import sentencepiece as spm

from twostep.artifact.config import ModelConfig
from twostep.errors import BadCheckpoint
from twostep.files import read_json
from twostep.model.hf.common import (
    TOKENIZER_JSON,
    CodedIds,
    HFModel,
    Imported,
    biased_generator,
    coded_tokenizer,
    common_config,
    embeddings,
    family,
    generator_tied,
    layers,
    notes,
    refuse_unsupported,
    tokenizer_config,
)
from twostep.model.importers import Mapper

CODE = re.compile(r"[a-z]{2}_[A-Z]{2}")  # en_XX, fr_XX, zh_CN
OFFSET = 2  # MBartLearnedPositionalEmbedding: position p reads row p + 2

# MBart50Tokenizer's ids without tokenizer.json (transformers' tokenization_mbart50.py): fairseq's dictionary
# begins <s> <pad> </s> <unk>, so a SentencePiece id i is the model's i + 1 (SentencePiece's own <unk> <s> </s>, its
# ids 0 to 2, are fairseq's); the language codes follow the pieces in this order, then <mask>.
FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
FAIRSEQ_OFFSET = 1
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
LANGUAGE_CODES = (
    "ar_AR", "cs_CZ", "de_DE", "en_XX", "es_XX", "et_EE", "fi_FI", "fr_XX", "gu_IN", "hi_IN", "it_IT", "ja_XX",
    "kk_KZ", "ko_KR", "lt_LT", "lv_LV", "my_MM", "ne_NP", "nl_XX", "ro_RO", "ru_RU", "si_LK", "tr_TR", "vi_VN",
    "zh_CN", "af_ZA", "az_AZ", "bn_IN", "fa_IR", "he_IL", "hr_HR", "id_ID", "ka_GE", "km_KH", "mk_MK", "ml_IN",
    "mn_MN", "mr_IN", "pl_PL", "ps_AF", "pt_XX", "sv_SE", "sw_KE", "ta_IN", "te_IN", "th_TH", "tl_XX", "uk_UA",
    "ur_PK", "xh_ZA", "gl_ES", "sl_SI")


@family("mbart")
def import_mbart(hf: HFModel) -> Imported:
    tokenizer_class = str(tokenizer_config(hf).get("tokenizer_class", ""))
    if tokenizer_class.startswith("MBartTokenizer"):
        raise BadCheckpoint(f"{hf.path}: an mBART-25 tokenizer ({tokenizer_class}: the language code after </s>); "
                            "twostep imports mBART-50 (MBart50Tokenizer: the language code first)")
    refuse_unsupported(hf, {"add_final_layer_norm": lambda v: v is False, "normalize_before": lambda v: v is False})
    sd = hf.state_dict()
    m = Mapper(sd, "mbart")
    src_key, _ = embeddings(m, sd, True)
    rows = m.shape(src_key)[0]
    spec, files, unk = coded_tokenizer(hf, rows, CODE, "en_XX", "mBART-50", lambda path: spm_ids(hf, path))
    tied = generator_tied(sd, src_key)
    cfg = ModelConfig(
        src_vocab_size=rows, tgt_vocab_size=rows, norm_placement="pre", positions="learned", embed_norm=True,
        share_embeddings=True, tie_generator=tied, unk_id=unk, bos_id=hf.get("bos_token_id", 0), **common_config(hf))
    layers(m, cfg)
    for side in ("encoder", "decoder"):
        m.norm(f"{side}.embed_norm", f"{side}.layernorm_embedding")
        m.norm(f"{side}.final_norm", f"{side}.layer_norm")
        table = f"{side}.embed_positions.weight"
        have = m.shape(table)[0]
        if have < cfg.max_positions + OFFSET:
            raise BadCheckpoint(f"{table} has {have} rows, but max_position_embeddings {cfg.max_positions} needs "
                                f"{cfg.max_positions + OFFSET} (its positions start at row {OFFSET}): the weights "
                                "do not belong to this config.json")
        m.put("pos_table" if side == "encoder" else "decoder_pos_table", table,
              lambda t: t[OFFSET : OFFSET + cfg.max_positions])
    m.put("src_embed.weight", src_key)
    biased_generator(m, tied)
    return Imported(m.build(cfg, None), spec, files, notes(hf))


def spm_ids(hf: HFModel, path: Path) -> CodedIds:
    """MBart50Tokenizer's ids from its SentencePiece model: fairseq's four specials, each piece at its own id + 1,
    the language codes after the pieces, <mask> last. Special tokens that the tokenizer files add beyond these
    would take ids only tokenizer.json knows: refused."""
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as exc:
        raise BadCheckpoint(f"{path}: cannot read the SentencePiece model ({exc})") from None
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if pieces[: len(SPM_SPECIALS)] != SPM_SPECIALS:
        raise BadCheckpoint(f"{path}: its first pieces are {' '.join(pieces[:3])}, not mBART-50's "
                            f"{' '.join(SPM_SPECIALS)}, so MBart50Tokenizer's numbering does not apply; save the "
                            f"tokenizer with transformers 5 (its save_pretrained writes {TOKENIZER_JSON})")
    after = len(pieces) + FAIRSEQ_OFFSET
    added = {**FAIRSEQ_SPECIALS, **{code: after + i for i, code in enumerate(LANGUAGE_CODES)},
             "<mask>": after + len(LANGUAGE_CODES)}
    table = {piece: i + FAIRSEQ_OFFSET for i, piece in enumerate(pieces) if i >= len(SPM_SPECIALS)}
    table.update(added)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        unknown = [t for t in declared_specials(hf, name) if t not in table]
        if unknown:
            raise BadCheckpoint(f"{hf.path / name}: special tokens {', '.join(unknown)} beyond MBart50Tokenizer's "
                                f"own, whose ids only a {TOKENIZER_JSON} gives; save the tokenizer with transformers 5 "
                                f"(its save_pretrained writes {TOKENIZER_JSON})")
    return CodedIds(path, table, added)


def declared_specials(hf: HFModel, name: str) -> list[str]:
    """The additional special tokens a tokenizer file names (transformers 4's additional_special_tokens and
    extra_special_tokens {name: token}, 5's extra_special_tokens list; strings or AddedToken objects)."""
    path = hf.path / name
    data: Any = read_json(path, BadCheckpoint) if path.is_file() else {}
    if not isinstance(data, dict):
        raise BadCheckpoint(f"{path}: expected a JSON object")
    tokens: list[Any] = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = data.get(key)
        tokens += list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    return [str(t.get("content")) if isinstance(t, dict) else str(t) for t in tokens]
