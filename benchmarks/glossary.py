"""Glossaries (issue 50): how often a translation uses the glossary's terms, its quality, and what the
constrained search costs, with and without the glossary, side by side in one run.

    python -m benchmarks.glossary [--models demo,marian,madlad] [--work DIR] [--sentences 200] [--iters 15]
                                  [--threads 2] [--json OUT] [--markdown OUT] [--smoke]

The models are the test suite's trained ones, each with a glossary written for its vocabulary:

- demo: the bundled demo model (English number words to German, twostep/demo/model) exported into `--work`
  (once), its test split's first `--sentences`, its references; a glossary of English number words and their
  German forms (which the model writes inside compound pieces: "▁siebenhundert");
- marian, madlad: tests/hf_models.py's Marian (shared vocabulary) and MADLAD-style T5, built by transformers,
  imported and exported into `--work` (once; later runs reuse them), the sentences they were trained on and
  their French references; a glossary of English nouns and their French translations.

Per model, greedy and beam 4 (the model's decoding defaults otherwise), without and with the glossary:

- term usage: of the (sentence, term) pairs where the glossary finds a term in the source, the share whose
  translation holds one of the term's targets as text (found as written);
- chrF (sacrebleu) against the references;
- speed (beam 4): the sentences in which a term is found, translated as one batch with the glossary (constrained)
  and without it, the median of `--iters` runs each, and their ratio (target <= 1.5x); and the sentences in which
  none is found, with the glossary (it finds nothing: they decode as without it) and without (target <= 1.02x).

twostep's ort-cpu backend with `--threads` intra-op threads. The machine's CPU is printed: speed depends on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.marian import cpu_model

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "twostep" / "demo" / "model"

DEMO_GLOSSARY = [("seven", "sieben"), ("twelve", "zwölf"), ("eleven", "elf"), ("thousand", "tausend"),
                 ("sixteen", "sechzehn"), ("nineteen", "neunzehn")]
FRENCH_GLOSSARY = [("cat", "chat"), ("dog", "chien"), ("garden", "jardin"), ("world", "monde"), ("park", "parc"),
                   ("fox", "renard"), ("morning", "matin")]


def demo_case(sentences: int, work: Path, artifact: Path | None = None):
    """The demo model exported into work/demo (once; `twostep export`'s defaults), or `artifact`, an export of
    it already made."""
    from twostep.exporter.export import export
    from twostep.model.tasks import get_task

    if artifact is None:
        artifact = work / "demo" / "art"
        if not (artifact / "manifest.json").is_file():
            export(DEMO, artifact)
    pairs = get_task("numbers-en-de").split("test")[:sentences]
    return artifact, {}, [s for s, _ in pairs], [t for _, t in pairs], DEMO_GLOSSARY


def hf_case(name: str, work: Path):
    """tests/hf_models.py's model `name`, imported and exported into work/name (kept for the next run)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import hf_models
    from twostep.exporter.export import export
    from twostep.model.hf import import_hf_directory

    art = work / name / "art"
    if not (art / "manifest.json").is_file():
        hf = hf_models.marian_dir(work / name / "hf") if name == "marian" else \
            hf_models.t5_dir(work / name / "hf", madlad=True)
        import_hf_directory(hf, work / name / "ckpt")
        export(work / name / "ckpt", art)
    langs = {"tgt_lang": "fra"} if name == "marian" else {"tgt_lang": "fr"}
    return art, langs, hf_models.SOURCE_TEXT, hf_models.TARGET_TEXT, FRENCH_GLOSSARY


def usage(glossary, sources: list[str], outputs: list[str]) -> tuple[int, int]:
    """(pairs whose translation holds a target of the term, pairs): the terms found in each source."""
    held = total = 0
    for source, output in zip(sources, outputs):
        for found in glossary.find(source):
            total += 1
            held += any(t in output for t in found.entry.targets)
    return held, total


def timed(fn, iters: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(name: str, art: Path, langs: dict, sources: list[str], references: list[str], entries, iters: int,
            threads: int) -> dict:
    import sacrebleu

    from twostep.runtime.glossary import Entry, Glossary
    from twostep.runtime.translator import open_translator

    glossary = Glossary([Entry(s, (t,)) for s, t in entries])
    row: dict = {"model": name, "sentences": len(sources)}
    for label, beam in (("greedy", 1), ("beam4", 4)):
        translator, backend = open_translator(art, options={"beam_size": beam}, threads=threads)
        with backend:
            plain = translator.translate(sources, **langs)
            termed = translator.translate_glossary(sources, glossary, **langs)
            if beam == 4:
                matched = [s for s in sources if glossary.find(s)]
                unmatched = [s for s in sources if not glossary.find(s)]
                speed = {}
                for part, chosen in (("matched", matched), ("unmatched", unmatched)):
                    if not chosen:
                        continue
                    without = timed(lambda: translator.translate(chosen, **langs), iters)
                    with_ = timed(lambda: translator.translate_glossary(chosen, glossary, **langs), iters)
                    speed[part] = {"sentences": len(chosen), "without_s": without, "with_s": with_,
                                   "ratio": with_ / without}
                row["speed"] = speed
        texts = [t.text for t in termed]
        for kind, outputs in (("without", plain), ("with", texts)):
            held, total = usage(glossary, sources, outputs)
            row[f"{label}_{kind}"] = {
                "term_usage": held / total if total else None, "terms": total,
                "chrf": sacrebleu.corpus_chrf(outputs, [references]).score}
        row[f"{label}_unmet"] = sum(len(t.unmet) for t in termed)
    return row


def markdown(rows: list[dict], cpu: str, threads: int) -> str:
    out = [f"Glossaries, {cpu}, {threads} threads (`python -m benchmarks.glossary`)\n",
           "| model | search | terms | term usage without | with | chrF without | with | unmet |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for label in ("greedy", "beam4"):
            a, b = r[f"{label}_without"], r[f"{label}_with"]
            out.append(f"| {r['model']} | {label} | {a['terms']} | {a['term_usage']:.0%} | {b['term_usage']:.0%} | "
                       f"{a['chrf']:.1f} | {b['chrf']:.1f} | {r[f'{label}_unmet']} |")
    out += ["", "| model | beam 4 batch | sentences | without (s) | with (s) | ratio | target |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        for part, target in (("matched", "<= 1.5x"), ("unmatched", "<= 1.02x")):
            if part in r["speed"]:
                s = r["speed"][part]
                out.append(f"| {r['model']} | {part} | {s['sentences']} | {s['without_s']:.3f} | {s['with_s']:.3f} | "
                           f"{s['ratio']:.2f}x | {target} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="demo,marian,madlad")
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "twostep-bench" / "glossary")
    p.add_argument("--sentences", type=int, default=200, help="the demo's test sentences")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--demo-artifact", type=Path, help="an export of the demo model to use (default: made in --work)")
    p.add_argument("--smoke", action="store_true", help="the demo only, 12 sentences, 1 timed run: seconds")
    args = p.parse_args(argv)
    names = ["demo"] if args.smoke else args.models.split(",")
    sentences, iters = (12, 1) if args.smoke else (args.sentences, args.iters)
    cpu = cpu_model()
    rows = []
    for name in names:
        case = demo_case(sentences, args.work, args.demo_artifact) if name == "demo" else hf_case(name, args.work)
        rows.append(measure(name, *case, iters=iters, threads=args.threads))
    table = markdown(rows, cpu, args.threads)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "threads": args.threads, "rows": rows}, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
