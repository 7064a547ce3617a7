"""The artifact directory is self-describing: greedy decoding with plain onnxruntime and manifest.json only,
no twostep runtime code, gives the same tokens as the twostep runtime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort

from twostep.model.tasks import get_task


def manifest_greedy(art_dir, sources: list[list[int]], max_new_tokens: int,
                    tgt_lang: str | None = None) -> list[list[int]]:
    """Greedy decoding as manifest.json describes it: the decoder starts from model.decoder_start_id (else bos),
    then the target language's forced tokens; model.never_generate ids are never picked."""
    m = json.loads((art_dir / "manifest.json").read_text())
    special = m["special_tokens"]
    assert m["schema_version"] == 3
    start = m["model"]["decoder_start_id"]
    forced = m["tokenizer"]["languages"]["target"][tgt_lang]["decoder"] if tgt_lang else []
    sessions = {g: ort.InferenceSession(str(art_dir / spec["file"]), providers=["CPUExecutionProvider"])
                for g, spec in m["graphs"].items()}
    dec = m["graphs"]["decoder"]
    out = []
    for src in sources:  # one sentence at a time: the simplest possible consumer
        ids = np.array([src], dtype=np.int64)
        mask = np.ones_like(ids)
        cross = dict(zip([t["name"] for t in m["graphs"]["encoder"]["outputs"]],
                         sessions["encoder"].run(None, {"input_ids": ids, "attention_mask": mask})))
        feeds = {"encoder_attention_mask": mask}
        for t in dec["inputs"]:
            if t["name"].startswith("past_") and "_cross_" in t["name"]:
                feeds[t["name"]] = cross["present_" + t["name"][len("past_"):]]
            elif t["name"].startswith("past_") and "_self_" in t["name"]:
                _, heads, _, head_dim = t["shape"]  # fixed ints in the manifest; batch and past_len symbolic
                feeds[t["name"]] = np.zeros((1, heads, 0, head_dim), dtype=np.float32)
        token, result = special["bos"] if start is None else start, []
        output_names = [t["name"] for t in dec["outputs"]]
        for step in range(max_new_tokens):
            feeds["input_ids"] = np.array([[token]], dtype=np.int64)
            feeds["past_lengths"] = np.array([step], dtype=np.int64)  # each row's history length
            outputs = dict(zip(output_names, sessions["decoder"].run(None, feeds)))
            logits = outputs["logits"][0, -1]
            logits[m["model"]["never_generate"]] = -np.inf
            token = forced[step] if step < len(forced) else int(logits.argmax())
            if token == special["eos"]:
                break
            if step >= len(forced):
                result.append(token)
            for name in output_names:  # besides the presents: the logits and the search outputs
                if name.startswith("present_"):
                    feeds["past_" + name[len("present_"):]] = outputs[name]
        out.append(result)
    return out


def test_plain_onnxruntime_with_the_manifest_gives_the_same_tokens(demo_artifact):
    from twostep.runtime.translator import open_translator

    translator, backend = open_translator(demo_artifact, "ort-cpu")
    with backend:
        sources = translator.encode([src for src, _ in get_task("numbers-en-de").split("test")[:40]])
        expected = translator.translate_ids(sources)
    assert manifest_greedy(demo_artifact, sources, max_new_tokens=64) == expected
    assert sum(len(e) for e in expected) > 40  # real translations, not empty ones


def test_plain_onnxruntime_decodes_pretrained_families_from_the_manifest(pretrained):
    """Marian's start from pad with pad never generated, M2M100's, NLLB's and mBART-50's forced target-language
    token: all in the manifest, read by a consumer that knows no family."""
    from conftest import NEW_TOKENS
    from hf_models import TEST_SENTENCES
    from twostep.runtime.translator import open_translator

    translator, backend = open_translator(pretrained.art)
    with backend:
        sources = translator.encode(TEST_SENTENCES, **pretrained.langs)
    tgt_lang = pretrained.langs.get("tgt_lang") if pretrained.other_target else None
    assert manifest_greedy(pretrained.art, sources, NEW_TOKENS, tgt_lang) == pretrained.greedy[0]
