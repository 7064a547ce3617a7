"""mBART-50 (MBartForConditionalGeneration with MBart50Tokenizer: many-to-many, one-to-many, many-to-one): pre-norm
layers with final norms, a norm after the embedding (`layernorm_embedding`), learned position tables, one per
stack, whose rows start at offset 2, `final_logits_bias` as the generator's bias, codes such as `en_XX`. The
source is [src_lang] pieces </s> as MBart50Tokenizer makes it, the decoder starts from </s> and the target
language is forced after it. mBART-25 (cc25: MBartTokenizer, the language code after </s>) is refused."""

from __future__ import annotations

import re

from twostep.artifact.config import ModelConfig
from twostep.errors import BadCheckpoint
from twostep.model.hf.common import (
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
    spec, files, unk = coded_tokenizer(hf, rows, CODE, "en_XX", "mBART-50")
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



