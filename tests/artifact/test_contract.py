"""The artifact directory is self-describing: greedy decoding with plain onnxruntime and manifest.json only,
no twostep runtime code, gives the same tokens as the twostep runtime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort

from twostep.model.tasks import get_task


def manifest_greedy(art_dir, sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    m = json.loads((art_dir / "manifest.json").read_text())
    special = m["special_tokens"]
    sessions = {g: ort.InferenceSession(str(art_dir / spec["file"]), providers=["CPUExecutionProvider"])
                for g, spec in m["graphs"].items()}
    dec = m["graphs"]["decoder"]
    out = []
    for src in sources:  # one sentence at a time: the simplest possible consumer
        ids = np.array([src], dtype=np.int64)
        mask = np.ones_like(ids)
        cross = dict(zip([t["name"] for t in m["graphs"]["encoder"]["outputs"]],
                         sessions["encoder"].run(None, {"input_ids": ids, "attention_mask": mask})))
        assert m["schema_version"] == 2
        feeds = {"encoder_attention_mask": mask}
        for t in dec["inputs"]:
            if t["name"].startswith("past_") and "_cross_" in t["name"]:
                feeds[t["name"]] = cross["present_" + t["name"][len("past_"):]]
            elif t["name"].startswith("past_") and "_self_" in t["name"]:
                _, heads, _, head_dim = t["shape"]  # fixed ints in the manifest; batch and past_len symbolic
                feeds[t["name"]] = np.zeros((1, heads, 0, head_dim), dtype=np.float32)
        token, result = special["bos"], []
        output_names = [t["name"] for t in dec["outputs"]]
        for step in range(max_new_tokens):
            feeds["input_ids"] = np.array([[token]], dtype=np.int64)
            feeds["past_lengths"] = np.array([step], dtype=np.int64)  # schema 2: each row's history length
            outputs = dict(zip(output_names, sessions["decoder"].run(None, feeds)))
            token = int(outputs["logits"][0, -1].argmax())
            if token == special["eos"]:
                break
            result.append(token)
            for name in output_names[1:]:
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
