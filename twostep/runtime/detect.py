"""The language of a text, among the languages a server translates from: what LibreTranslate's `source: "auto"` asks.

The detector is lingua (pip `lingua-language-detector`, Apache-2.0), its detector built from the served languages
only, in high-accuracy mode, its models loaded lazily. benchmarks/detectors.py chose it (docs/serving.md has the
table): on sentences and paragraphs lingua, langdetect and py3langid are all right on the gold set; on single words
and short chat phrases lingua is the most accurate of the permissively licensed ones, and it alone is restricted to
the candidates by construction, gives confidences that add up over them, and answers nothing for a text no served
language can be written in (Cyrillic when only Latin-script languages are served). Its cost is memory: its models
take about 20 MB a language once loaded (~250 MB for 13), shared by every language set. LibreTranslate's own
detector asks a word list (lexilang) first for texts under 20 characters, which gets more greetings right ("Hello",
"Merci"), but lexilang is AGPL-3.0: not a dependency of ours.

What differs from LibreTranslate: it detects one language for the whole batch of `q`; we answer each text of a
batch, so that a batch in several languages is translated from each text's own.

Languages are BCP-47 tags as the caller serves them ("en", "fr", "pt-BR", "nb", "zh-Hans") and come back as given.
Each maps to lingua's language by its base ("pt-BR" is Portuguese; "no" is Bokmål, "fil" Tagalog); a served tag
lingua does not know is never an answer. lingua has one Chinese: "zh-Hans" and "zh-Hant" both map to it, and a
Chinese text gets the Chinese tags that are served, both at the same confidence if both are (in the order given).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import langcodes

from twostep.errors import BackendUnavailable

# Tags whose base language lingua spells otherwise: macrolanguage Norwegian is written Bokmål far more often;
# langcodes spells Tagalog as Filipino.
ALIASES = {"no": "nb", "fil": "tl"}


class Detector:
    """lingua's detectors, one per set of served languages (built at its first use, kept: a server asks with the same
    set every time). Thread-safe: a lingua detector is immutable and the cache is filled under a lock."""

    def __init__(self, lingua):
        self._lingua = lingua
        self._detectors: dict[tuple[str, ...], tuple[object, dict] | None] = {}
        self._lock = threading.Lock()

    def detect(self, texts: Sequence[str], languages: Sequence[str]) -> list[list[tuple[str, float]]]:
        """For each text, candidates best first: (tag, confidence 0-100), each tag one of `languages` (BCP-47 tags as
        given); [] where no candidate matches (or the text has no letters). The confidences of a text add up to 100
        over the candidates (a Chinese text served as both zh-Hans and zh-Hant counts twice)."""
        built = self._detector(tuple(languages))
        if built is None:
            return [[] for _ in texts]
        detector, tags = built
        out = []
        for text in texts:
            values = detector.compute_language_confidence_values(text)  # best first
            out.append([(tag, 100 * v.value) for v in values if v.value > 0 for tag in tags[v.language]])
        return out

    def _detector(self, languages: tuple[str, ...]):
        """(lingua's detector for the languages, {lingua language: [tag, ...]}), or None if lingua knows none."""
        with self._lock:
            if languages not in self._detectors:
                tags: dict[object, list[str]] = {}
                for tag in languages:
                    language = self._language(tag)
                    if language is not None and tag not in tags.setdefault(language, []):
                        tags[language].append(tag)
                builder = self._lingua.LanguageDetectorBuilder
                self._detectors[languages] = (builder.from_languages(*tags).build(), tags) if tags else None
            return self._detectors[languages]

    def _language(self, tag: str):
        """lingua's language for a BCP-47 tag, or None where lingua has none (or the tag is not one)."""
        try:
            base = langcodes.Language.get(tag).language or ""  # "und" has none
            code = self._lingua.IsoCode639_1.from_str(ALIASES.get(base, base))
        except ValueError:  # langcodes' LanguageTagError is one
            return None
        return self._lingua.Language.from_iso_code_639_1(code)


def open_detector() -> Detector:
    """The language detector `twostep serve` uses; BackendUnavailable if lingua is not installed."""
    try:
        import lingua
    except ImportError as e:
        raise BackendUnavailable(
            f"language detection (source \"auto\") needs lingua, which is not installed here ({e}); "
            "install it: pip install 'twostep[serve]' (or pip install lingua-language-detector)") from e
    return Detector(lingua)
