"""NLLB-200 (No Language Left Behind): M2M100's architecture (model_type m2m_100) with NllbTokenizer: language
codes such as `eng_Latn`, numbered by its tokenizer.json, an embedding with more rows than the tokenizer has ids
(never produced by it; transformers can generate them, so twostep keeps them). The source is
[src_lang] pieces </s> (transformers' default, not its legacy order), the decoder starts from </s> and the
target language is forced after it."""

from __future__ import annotations

import re

from twostep.model.hf.common import HFModel, Imported, coded_tokenizer, family, notes
from twostep.model.hf.m2m100 import m2m100_model

CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # eng_Latn, zho_Hant


@family("nllb")
def import_nllb(hf: HFModel) -> Imported:
    rows = hf.get("vocab_size")
    spec, files, unk = coded_tokenizer(hf, rows if isinstance(rows, int) else 0, CODE, "eng_Latn", "NLLB")
    model, _ = m2m100_model(hf, unk_id=unk)
    return Imported(model, spec, files, notes(hf), family="nllb")
