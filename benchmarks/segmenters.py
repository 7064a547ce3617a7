"""Sentence segmenters side by side on a small hand-written gold set (benchmarks/segmenters_gold.json: English,
French, German, Spanish, Chinese, Japanese, Russian; abbreviations, numbers, quotes, ellipses, lists, paragraph
breaks): which one twostep's documents (twostep/runtime/documents.py) split with.

    python -m benchmarks.segmenters [--engines twostep,sentencex,pysbd,blingfire,regex] [--repeat 50]
                                    [--json OUT] [--markdown OUT]

Engines (one not installed is skipped; install the others outside the project, e.g.
`pip install --target /tmp/seg pysbd blingfire` and `PYTHONPATH=/tmp/seg`):

- twostep: what documents.py does, sentencex within each line (a line break always ends a sentence).
- sentencex: `segment(lang, text)` on the whole text.
- pysbd: `Segmenter(language=lang, clean=False)`, one per language (built outside the timing).
- blingfire: `text_to_sentences_and_offsets(text)`, one model for every language.
- regex: a baseline, after . ! ? … (and closing quotes) before whitespace, after 。！？ always, at line breaks.

A boundary is where a sentence ends, its trailing whitespace aside, the text's end excepted. Reported per
language and over all: boundary precision, recall and F1 (micro, over the gold set's documents), and
milliseconds per 1,000 gold sentences (the gold set segmented --repeat times; median of 3 runs; "all": the mean of
the languages'). The table has one row an engine, each cell precision / recall / F1; --json has every number.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

GOLD = Path(__file__).with_name("segmenters_gold.json")
ENGINES = ("twostep", "sentencex", "pysbd", "blingfire", "regex")
MODULES = {"twostep": "sentencex", "sentencex": "sentencex", "pysbd": "pysbd", "blingfire": "blingfire",
           "regex": "re"}
REGEX = re.compile(r"[.!?…]+[\"'»”’)\]]*(?=\s)|[。！？]+[」』”’）]*|\n")


def load_gold(path: Path = GOLD) -> dict[str, list[list[str]]]:
    return json.loads(path.read_text(encoding="utf-8"))["languages"]


def ends(text: str, pieces: list[str]) -> set[int]:
    """The boundaries of sentences given as strings in text order: each found from where the last ended."""
    out, at = set(), 0
    for piece in pieces:
        core = piece.strip()
        if not core:
            continue
        found = text.find(core, at)
        if found < 0:  # an engine that rewrote its sentence: the boundary is lost, not guessed
            continue
        at = found + len(core)
        out.add(at)
    return out


def span_ends(text: str, spans) -> set[int]:
    return {start + len(text[start:end].rstrip()) for start, end in spans if text[start:end].strip()}


def gold_ends(sentences: list[str]) -> set[int]:
    out, at = set(), 0
    for sentence in sentences:
        out.add(at + len(sentence.rstrip()))
        at += len(sentence)
    return out


def regex_spans(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for m in REGEX.finditer(text):
        spans.append((start, m.start() if m.group() == "\n" else m.end()))
        start = m.end()
    return spans + [(start, len(text))]


def engine(name: str) -> Callable[[str, str], set[int]] | None:
    """`boundaries(lang, text)` of an installed engine, else None."""
    if importlib.util.find_spec(MODULES[name]) is None:
        return None
    if name == "twostep":
        from twostep.runtime.documents import sentence_spans

        return lambda lang, text: span_ends(text, sentence_spans(text, lang))
    if name == "sentencex":
        from sentencex import segment

        return lambda lang, text: ends(text, list(segment(lang, text)))
    if name == "pysbd":
        import pysbd

        segmenters = {}

        def pysbd_ends(lang, text):
            if lang not in segmenters:
                segmenters[lang] = pysbd.Segmenter(language=lang, clean=False)
            return ends(text, segmenters[lang].segment(text))

        return pysbd_ends
    if name == "blingfire":
        import blingfire

        return lambda lang, text: span_ends(text, blingfire.text_to_sentences_and_offsets(text)[1])
    return lambda lang, text: span_ends(text, regex_spans(text))


def score(boundaries, lang: str, documents: list[list[str]]) -> dict:
    hits = found = wanted = 0
    for sentences in documents:
        text = "".join(sentences)
        gold = gold_ends(sentences) - {len(text.rstrip())}
        got = boundaries(lang, text) - {len(text.rstrip())}
        hits, found, wanted = hits + len(gold & got), found + len(got), wanted + len(gold)
    return {"hits": hits, "found": found, "gold": wanted}


def rates(counts: dict) -> dict:
    p = counts["hits"] / counts["found"] if counts["found"] else 0.0
    r = counts["hits"] / counts["gold"] if counts["gold"] else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def ms_per_1000(boundaries, lang: str, documents: list[list[str]], repeat: int) -> float:
    texts = ["".join(sentences) for sentences in documents]
    boundaries(lang, texts[0])  # warm up (pysbd builds its segmenter)
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeat):
            for text in texts:
                boundaries(lang, text)
        runs.append(time.perf_counter() - started)
    sentences = repeat * sum(len(d) for d in documents)
    return 1000 * statistics.median(runs) / sentences * 1000


def run(engines: list[str], gold: dict[str, list[list[str]]], repeat: int) -> dict:
    rows, skipped = [], []
    for name in engines:
        boundaries = engine(name)
        if boundaries is None:
            skipped.append(name)
            continue
        total = {"hits": 0, "found": 0, "gold": 0}
        times = []
        for lang, documents in gold.items():
            counts = score(boundaries, lang, documents)
            total = {k: total[k] + counts[k] for k in total}
            times.append(ms_per_1000(boundaries, lang, documents, repeat))
            rows.append({"engine": name, "language": lang, **counts, **rates(counts), "ms_per_1000": times[-1]})
        rows.append({"engine": name, "language": "all", **total, **rates(total),
                     "ms_per_1000": statistics.mean(times)})
    return {"rows": rows, "skipped": skipped, "repeat": repeat,
            "sentences": sum(len(d) for docs in gold.values() for d in docs)}


def markdown(result: dict) -> str:
    """One row an engine: precision / recall / F1 for each language and over all, and the mean time."""
    languages = list(dict.fromkeys(r["language"] for r in result["rows"]))
    lines = ["| engine | " + " | ".join(languages) + " | ms / 1,000 sentences |",
             "|---|" + "---|" * len(languages) + "---:|"]
    for name in dict.fromkeys(r["engine"] for r in result["rows"]):
        rows = {r["language"]: r for r in result["rows"] if r["engine"] == name}
        cells = [f"{rows[lang]['precision']:.2f} / {rows[lang]['recall']:.2f} / {rows[lang]['f1']:.2f}"
                 for lang in languages]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {rows['all']['ms_per_1000']:.1f} |")
    if result["skipped"]:
        lines.append(f"\nNot installed, skipped: {', '.join(result['skipped'])}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--repeat", type=int, default=50, help="times the gold set is segmented for the timing")
    p.add_argument("--gold", type=Path, default=GOLD)
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(engines) - set(ENGINES):
        p.error(f"unknown engines {sorted(set(engines) - set(ENGINES))}; choose from {', '.join(ENGINES)}")
    result = run(engines, load_gold(args.gold), args.repeat)
    table = markdown(result)
    sys.stdout.write(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
