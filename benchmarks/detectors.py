"""Language detectors side by side on a small hand-written gold set (benchmarks/detectors_gold.json: 13 languages,
single words, short phrases, sentences and paragraphs, greetings, names, numbers and loanwords among them): which
one `twostep serve` detects `source: "auto"` with (twostep/runtime/detect.py).

    python -m benchmarks.detectors [--engines twostep,lingua,...] [--served en,fr,de,es,it,pt] [--repeat 5]
                                   [--no-memory] [--json OUT] [--markdown OUT]

Engines (one not installed is skipped; pip names lingua-language-detector, langdetect, py3langid, lexilang):

- twostep: twostep.runtime.detect, what the server runs.
- lingua: lingua's detector built from the candidate languages (lazily loaded models, high accuracy).
- lingua-preloaded: the same with `.with_preloaded_language_models()` (the cost moves to building it).
- lingua-low: the same in low-accuracy mode (trigrams only).
- langdetect: `detect_langs(text)` (seed 0), its best language among the candidates; it cannot be restricted.
- py3langid: an identifier of its own restricted with `set_languages`, probabilities normalized.
- lexilang: `detect(text, candidates)`, a word list; what LibreTranslate asks first for texts under 20 characters.
- libretranslate: LibreTranslate's own detector (libretranslate/detect.py, v1.9.6) re-created: lexilang under 20
  characters when it is confident at all, else langdetect's best among the candidates, else "en".

Each engine is given the candidate languages as tags and answers one tag, or none. Two candidate sets: "full",
every language of the gold set, and "served" (--served), the texts of the other languages left out. Reported per
set and length bucket: accuracy (top answer right), and milliseconds per text (the set's texts detected --repeat
times; median of 3 runs; after one untimed pass, so lazily loaded models are in). In a fresh subprocess per engine
and set: MB, the resident memory the engine added (Linux /proc; building it and one pass over the set's texts),
and cold_s, the seconds that took (--no-memory: not measured). --json has every number.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import langcodes

GOLD = Path(__file__).with_name("detectors_gold.json")
ENGINES = ("twostep", "lingua", "lingua-preloaded", "lingua-low", "langdetect", "py3langid", "lexilang",
           "libretranslate")
MODULES = {"twostep": "lingua", "lingua": "lingua", "lingua-preloaded": "lingua", "lingua-low": "lingua",
           "langdetect": "langdetect", "py3langid": "py3langid", "lexilang": "lexilang", "libretranslate": "lexilang"}
BUCKETS = ("word", "phrase", "sentence", "paragraph")
SERVED = "en,fr,de,es,it,pt"

Detect = Callable[[str], str | None]


def load_gold(path: Path = GOLD) -> dict[str, dict[str, list[str]]]:
    """{tag: {bucket: [text, ...]}}."""
    return json.loads(path.read_text(encoding="utf-8"))["languages"]


def matcher(candidates: Sequence[str]) -> Callable[[str], str | None]:
    """The candidate tag an engine's code names: same language and script once both are filled in ("zh-cn" is
    zh-Hans, "en" en-Latn), or the candidate of the same language when the script differs; else None."""
    def key(tag):
        full = langcodes.Language.get(tag).maximize()
        return full.language, full.script

    exact = {key(tag): tag for tag in candidates}
    by_language = {key(tag)[0]: tag for tag in candidates}

    def match(code):
        if not code:
            return None
        k = key(code)
        return exact.get(k) or by_language.get(k[0])

    return match


def lingua_detector(candidates: Sequence[str], *, preloaded=False, low=False) -> Detect:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    languages = {}
    for tag in candidates:
        try:
            languages[Language.from_iso_code_639_1(IsoCode639_1.from_str(langcodes.Language.get(tag).language))] = tag
        except ValueError:  # a language lingua does not know: never its answer
            pass
    builder = LanguageDetectorBuilder.from_languages(*languages)
    if preloaded:
        builder = builder.with_preloaded_language_models()
    if low:
        builder = builder.with_low_accuracy_mode()
    detector = builder.build()

    def detect(text):
        found = detector.detect_language_of(text)
        return languages[found] if found is not None else None

    return detect


def langdetect_codes(text: str) -> list[tuple[str, float]]:
    """langdetect's languages for text, best first, as (code, probability); [] when it cannot tell."""
    from langdetect import DetectorFactory, LangDetectException, detect_langs

    DetectorFactory.seed = 0
    try:
        return [(found.lang, found.prob) for found in detect_langs(text)]
    except LangDetectException:
        return []


def langdetect_detector(candidates: Sequence[str]) -> Detect:
    match = matcher(candidates)

    def detect(text):
        return next((match(code) for code, _ in langdetect_codes(text) if match(code)), None)

    return detect


def py3langid_detector(candidates: Sequence[str]) -> Detect:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    codes = {langcodes.Language.get(tag).language: tag for tag in candidates}
    identifier.set_languages([code for code in codes if code in identifier.labels])

    def detect(text):
        code, _ = identifier.classify(text)
        return codes.get(code)

    return detect


def lexilang_detector(candidates: Sequence[str]) -> Detect:
    from lexilang.detector import detect as lexilang_detect

    codes = {langcodes.Language.get(tag).language: tag for tag in candidates}

    def detect(text):
        code, confidence = lexilang_detect(text, list(codes))
        return codes.get(code) if confidence > 0 else None

    return detect


def libretranslate_detector(candidates: Sequence[str]) -> Detect:
    """libretranslate/detect.py's Detector.detect, its first answer: lexilang for texts under 20 characters when
    its confidence is above 0, else langdetect's best among the candidates, else "en" (at confidence 0)."""
    from lexilang.detector import detect as lexilang_detect

    codes = {langcodes.Language.get(tag).language: tag for tag in candidates}
    match = matcher(candidates)

    def detect(text):
        if len(text) < 20:
            code, confidence = lexilang_detect(text, list(codes))
            if confidence > 0:
                return codes.get(code)
        found = [(code, p) for code, p in langdetect_codes(text) if match(code)]
        if not found or found[0][1] == 0:
            return match("en")
        return match(found[0][0])

    return detect


def twostep_detector(candidates: Sequence[str]) -> Detect:
    from twostep.runtime.detect import open_detector

    detector = open_detector()
    candidates = list(candidates)

    def detect(text):
        found = detector.detect([text], candidates)[0]
        return found[0][0] if found else None

    return detect


def engine(name: str) -> Callable[[Sequence[str]], Detect] | None:
    """`make(candidates)` of an installed engine: a detector for those candidate tags; else None."""
    if importlib.util.find_spec(MODULES[name]) is None or (
            name == "libretranslate" and importlib.util.find_spec("langdetect") is None):
        return None
    return {"twostep": twostep_detector,
            "lingua": lingua_detector,
            "lingua-preloaded": lambda candidates: lingua_detector(candidates, preloaded=True),
            "lingua-low": lambda candidates: lingua_detector(candidates, low=True),
            "langdetect": langdetect_detector,
            "py3langid": py3langid_detector,
            "lexilang": lexilang_detector,
            "libretranslate": libretranslate_detector}[name]


def items(gold: dict, languages: Sequence[str], bucket: str) -> list[tuple[str, str]]:
    """(tag, text) of the bucket, for the languages given."""
    return [(tag, text) for tag in languages for text in gold[tag][bucket]]


def score(detect: Detect, pairs: list[tuple[str, str]]) -> dict:
    right = sum(detect(text) == tag for tag, text in pairs)
    return {"right": right, "texts": len(pairs), "accuracy": right / len(pairs) if pairs else 0.0}


def ms_per_text(detect: Detect, texts: list[str], repeat: int) -> float:
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeat):
            for text in texts:
                detect(text)
        runs.append(time.perf_counter() - started)
    return 1000 * statistics.median(runs) / (repeat * len(texts))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status: the memory measure needs Linux")


def footprint(name: str, languages: Sequence[str], gold_path: Path) -> dict:
    """In this process (a fresh one): the memory an engine adds, built for languages and run once over their texts,
    and the seconds that took."""
    gold = load_gold(gold_path)
    texts = [text for bucket in BUCKETS for _, text in items(gold, languages, bucket)]
    before, started = rss_mb(), time.perf_counter()
    detect = engine(name)(languages)
    for text in texts:
        detect(text)
    return {"mb": rss_mb() - before, "cold_s": time.perf_counter() - started}


def measure_footprint(name: str, languages: Sequence[str], gold_path: Path) -> dict:
    """footprint() in a fresh interpreter, so that no other engine's imports or models count."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "benchmarks.detectors", "--footprint", name,
                           "--served", ",".join(languages), "--gold", str(gold_path)],
                          cwd=root, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def run(engines: list[str], gold_path: Path, served: list[str], repeat: int, memory: bool = True) -> dict:
    gold = load_gold(gold_path)
    sets = {"full": list(gold), "served": [tag for tag in gold if tag in served]}
    rows, skipped = [], []
    for name in engines:
        make = engine(name)
        if make is None:
            skipped.append(name)
            continue
        for set_name, languages in sets.items():
            detect = make(languages)
            row = {"engine": name, "set": set_name, "languages": languages, "buckets": {}, "per_language": {}}
            for bucket in BUCKETS:
                pairs = items(gold, languages, bucket)
                texts = [text for _, text in pairs]
                detect(texts[0])  # untimed: lazily loaded models in
                row["buckets"][bucket] = {**score(detect, pairs), "ms_per_text": ms_per_text(detect, texts, repeat)}
            pairs = [pair for bucket in BUCKETS for pair in items(gold, languages, bucket)]
            row["all"] = {**score(detect, pairs),
                          "ms_per_text": ms_per_text(detect, [text for _, text in pairs], repeat)}
            for tag in languages:
                row["per_language"][tag] = score(detect, [pair for pair in pairs if pair[0] == tag])
            row.update(measure_footprint(name, languages, gold_path) if memory else {"mb": None, "cold_s": None})
            rows.append(row)
    return {"rows": rows, "skipped": skipped, "repeat": repeat, "served": sets["served"],
            "texts": {set_name: sum(len(gold[tag][b]) for tag in languages for b in BUCKETS)
                      for set_name, languages in sets.items()}}


def markdown(result: dict) -> str:
    """One row an engine and candidate set: accuracy per bucket and over all, ms per text, MB and cold seconds."""
    lines = ["| engine | set | " + " | ".join(BUCKETS) + " | all | ms / text | MB | cold s |",
             "|---|---|" + "---:|" * (len(BUCKETS) + 4)]
    for row in result["rows"]:
        cells = [f"{row['buckets'][bucket]['accuracy']:.2f}" for bucket in BUCKETS]
        lines.append(f"| {row['engine']} | {row['set']} | " + " | ".join(cells)
                     + f" | {row['all']['accuracy']:.2f} | {row['all']['ms_per_text']:.3f} | "
                     + (f"{row['mb']:.0f} | {row['cold_s']:.2f} |" if row["mb"] is not None else "- | - |"))
    lines.append(f"\nfull: {result['texts']['full']} texts; served ({', '.join(result['served'])}): "
                 f"{result['texts']['served']} texts.")
    if result["skipped"]:
        lines.append(f"Not installed, skipped: {', '.join(result['skipped'])}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--served", default=SERVED, help="the small candidate set, comma-separated tags")
    p.add_argument("--repeat", type=int, default=5, help="times each bucket is detected for the timing")
    p.add_argument("--gold", type=Path, default=GOLD)
    p.add_argument("--no-memory", action="store_true", help="skip the fresh process per engine (MB, cold s)")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--footprint", choices=ENGINES, help=argparse.SUPPRESS)  # the subprocess of the memory measure
    args = p.parse_args(argv)
    served = [tag.strip() for tag in args.served.split(",") if tag.strip()]
    if args.footprint:
        sys.stdout.write(json.dumps(footprint(args.footprint, served, args.gold)) + "\n")
        return 0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(engines) - set(ENGINES):
        p.error(f"unknown engines {sorted(set(engines) - set(ENGINES))}; choose from {', '.join(ENGINES)}")
    result = run(engines, args.gold, served, args.repeat, memory=not args.no_memory)
    table = markdown(result)
    sys.stdout.write(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
