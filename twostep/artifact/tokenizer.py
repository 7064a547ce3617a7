"""How text becomes token ids and back: the manifest's `tokenizer` section (schema 3), which every consumer
(the Python runtime, the C++ library) follows the same way.

    kind                         "sentencepiece" (default), "tokenizers": a Hugging Face tokenizer.json that the
                                 tokenizers library runs (NLLB and mBART-50 as transformers 5 saves them), or
                                 "moses-bpe": Moses tokenization (sacremoses) then subword-nmt's BPE codes, "@@ "
                                 joined and Moses detokenization on the way back (OPUS-MT's older models, Argos's
                                 bpe.model packages); the last two Python only: the C++ library refuses text for
                                 them and takes token ids
    source_model, target_model   SentencePiece models: one splits source text into pieces, one joins target
                                 pieces into text (the same file where a model has one); for "tokenizers" the
                                 tokenizer.json, which gives the model's ids itself (added tokens included); for
                                 "moses-bpe" the BPE codes (both sides: the target needs none to join its pieces)
    moses                        "moses-bpe": [source, target], the languages Moses tokenizes and detokenizes as
    source_vocab, target_vocab   {piece: id} tables where the model's ids are not SentencePiece's own (Marian's
                                 vocab.json, M2M100's fairseq-ordered vocabulary with its language tokens); null:
                                 SentencePiece's ids are the model's (the seeds)
    source_suffix                ids after every source sentence (eos)
    detokenize                   how target pieces become text: "sentencepiece" (default: SentencePiece joins them,
                                 leading and trailing spaces stripped) or "argos" (as argostranslate does:
                                 SentencePiece joins them, then "▁" and "_" become spaces and one leading
                                 space goes)
    trailing_space               ids after a stretch of text (between special pieces, or the last) that ends in
                                 whitespace (space, tab, newline, CR, FF, VT): tokenizers' Metaspace keeps it as a
                                 "▁" piece where SentencePiece drops it (NLLB's tokenizer.json); () for none
    special_pieces               pieces found anywhere in the text, each one id (">>fra<<", "__fr__", "</s>")
    unk_id                       the source id of a piece missing from source_vocab
    drop_ids                     ids left out of decoded text (pad, eos, unk, language tokens)
    languages                    source: {code: ids before the source pieces}; target: {code: {source: ids before
                                 the source pieces, decoder: ids forced on the decoder after its start id}};
                                 default_source, default_target: the codes used when a request names none;
                                 a request may name a language by the model's code or a standard one
                                 (standard_matches); aliases (optional): {standard code, normalized: the model
                                 codes it means} (standard_aliases), written for consumers without langcodes

A source sentence is languages.source[src] + languages.target[tgt].source + pieces + source_suffix; the decoder
starts from the model's start id (model.decoder_start_id, else bos) followed by languages.target[tgt].decoder.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twostep.artifact.trust import safe_name
from twostep.errors import BadArtifact, BadInput

Ids = tuple[int, ...]
KINDS = ("sentencepiece", "tokenizers", "moses-bpe")
DETOKENIZERS = ("sentencepiece", "argos")


class MissingLanguage(BadInput):
    """A request without a language where the model needs one. Its message names the CLI's option; a front with
    other names (the HTTP API's fields) words it with `worded`."""

    OPTIONS = {"source": "--src-lang", "target": "--tgt-lang"}  # the CLI's
    FIELDS = {"source": "src_lang", "target": "tgt_lang"}  # the HTTP API's, the Python API's arguments

    def __init__(self, side: str, known: Mapping[str, Any]):
        self.side, self.codes = side, sorted(known)
        super().__init__(self.worded(self.OPTIONS[side]))

    def worded(self, name: str) -> str:
        return f"this model needs a {self.side} language: {name} one of {', '.join(self.codes)}"


# Two tags name the same language for langcodes below this distance (fr-FR and fr: 4, pt-PT and pt: 5, no and nb:
# 1, ar and arb: 0); Moroccan Arabic against Arabic is 14. A script must also agree (sr-Latn is not sr-Cyrl: 5).
SAME_LANGUAGE = 10


def model_tag(code: str) -> str:
    """A model's language code as a BCP-47 tag: NLLB's fra_Latn -> fr, mBART's fr_XX (XX: no region) -> fr,
    Marian's fra -> fr, zho_Hant -> zh-Hant. ValueError where it is none."""
    import langcodes

    return langcodes.standardize_tag("-".join(p for p in code.replace("_", "-").split("-") if p != "XX"))


def standard_matches(code: str, known: Iterable[str]) -> list[str]:
    """The model codes (of `known`) that a standard code means: an ISO 639-1 or 639-3 code or a BCP-47 tag (fr,
    fra, fre, fr-FR, zh-Hant, zh-TW), by langcodes: the same language (regions and macrolanguages aside) in the
    same script, the nearest; several equally near are ambiguous, none is an unknown code. Remembered: every
    sentence of a request asks again (0.45 ms against NLLB's 202 codes)."""
    return list(_standard_matches(code, tuple(sorted(known))))


@functools.lru_cache(maxsize=1024)
def _standard_matches(code: str, known: tuple[str, ...]) -> tuple[str, ...]:
    import langcodes

    try:
        wanted = langcodes.standardize_tag(code)
        script = langcodes.Language.get(wanted).maximize().script
    except ValueError:
        return ()
    near = {}
    for own in known:
        try:
            tag = model_tag(own)
            if langcodes.Language.get(tag).maximize().script != script:
                continue
        except ValueError:
            continue
        distance = langcodes.tag_distance(wanted, tag)
        if distance < SAME_LANGUAGE:
            near[own] = distance
    best = min(near.values(), default=None)
    return tuple(sorted(own for own, distance in near.items() if distance == best))


# Regions typed often with a language (en-GB, pt-PT, es-MX, zh-SG): tried where a model has several codes of one
# language, whose distances a region may tip. Where it has one, only the regions that change the script matter
# (zh-TW: Hant), which langcodes' likely subtags list.
COMMON_REGIONS = ("US", "GB", "AU", "CA", "IN", "IE", "FR", "BE", "CH", "DE", "AT", "ES", "MX", "AR", "CO", "419",
                  "BR", "PT", "AO", "CN", "TW", "HK", "MO", "SG", "EG", "MA", "SA", "RS", "BA", "ME", "AF", "IR",
                  "PK")


def normalized(code: str) -> str:
    """A code as the manifest's aliases key it: lowercase, '-' between subtags (cpp/src/manifest.cpp alike)."""
    return code.lower().replace("_", "-")


def region_dropped(key: str) -> str | None:
    """A normalized tag without its last subtag where that is a region (2 letters or 3 digits after the language
    and script): fr-ca -> fr, zh-hant-tw -> zh-hant; None where it has none, or two (fa-af-tw)."""
    def region(tag: str) -> bool:
        last = tag.rpartition("-")[2]
        return "-" in tag and ((len(last) == 2 and last.isalpha()) or (len(last) == 3 and last.isdigit()))

    head = key.rpartition("-")[0]
    return head if region(key) and not region(head) else None  # one region only: fa-af-tw is no tag


def language_forms(language: str) -> set[str]:
    """A language subtag and its ISO 639-3 (639-2/T) and 639-2/B codes: fr, fra, fre."""
    import langcodes

    forms = {language}
    for variant in ("T", "B"):
        try:
            forms.add(langcodes.Language.get(language).to_alpha3(variant=variant))
        except (LookupError, ValueError):
            pass
    return forms


def standard_aliases(codes: Iterable[str]) -> dict[str, list[str]]:
    """The standard codes that mean a model's codes, for consumers without langcodes (the C++ library): {normalized
    code: the model codes standard_matches gives}, several: ambiguous. Tried: every ISO 639-1 language and each
    model code's language (its macrolanguage's too, and the members langcodes reads as it: ar for arb, cmn for
    zh), each by its 639-1, 639-3 and 639-2/B codes, alone and with each script it is written in (CLDR's likely
    subtags: sr-Latn, zh-Hant) or the model code's (written where it means some code: sr-latn means Croatian and
    Bosnian where the model has Serbian in Cyrillic only); the model codes themselves and their BCP-47 tags; and
    region tags (the model code's, its language's likely-subtag regions, COMMON_REGIONS where the model has several
    codes of the language), written only where they mean other codes than the same tag without the region (zh-tw:
    zho_Hant where zh is zho_Hans; uz-af: [] where uz is uzn_Latn, an Arabic-script region), so that a consumer
    drops an unlisted region and looks again."""
    import langcodes
    from langcodes.data_dicts import (
        LANGUAGE_ALPHA3,
        LANGUAGE_REPLACEMENTS,
        LIKELY_SUBTAGS,
        MACROLANGUAGES,
        NORMALIZED_MACROLANGUAGES,
    )

    known = sorted(set(codes))
    parsed = {}
    for own in known:
        try:
            parsed[own] = langcodes.Language.get(model_tag(own))
        except ValueError:
            continue
    likely: dict[str, tuple[set[str], set[str]]] = {}  # language: (its scripts, the regions that change it)
    for key, value in LIKELY_SUBTAGS.items():
        head, _, region = key.partition("-")
        scripts, regions = likely.setdefault(head, (set(), set()))
        scripts.add(value.split("-")[1])
        if region_dropped(key.lower()) == head.lower():
            regions.add(region)
    related = {}  # a code's language, its macrolanguage and the members langcodes reads as it (arb: ar; zh: cmn)
    for own, lang in parsed.items():
        near = {lang.language, own.replace("-", "_").split("_")[0], MACROLANGUAGES.get(lang.language)}
        near |= {member for member, macro in NORMALIZED_MACROLANGUAGES.items() if macro == lang.language}
        related[own] = near - {None}
    per_language: dict[str, int] = {}  # how many codes each language is related to (fa: pes_Arab and prs_Arab)
    for near in related.values():
        for language in near:
            per_language[language] = per_language.get(language, 0) + 1
    languages: dict[str, set[str]] = {language: set() for language in [*LANGUAGE_ALPHA3, *LANGUAGE_ALPHA3.values(),
                                                                       *LANGUAGE_REPLACEMENTS] if "-" not in language}
    regional: set[tuple[str, str]] = set()  # (language form, region)
    plain = {normalized(own) for own in parsed} | {normalized(str(lang)) for lang in parsed.values()}
    for own, lang in parsed.items():
        for language in related[own]:
            languages.setdefault(language, set()).update({lang.script, lang.maximize().script} - {None})
            regions = likely.get(language, (set(), set()))[1] | ({lang.territory} if lang.territory else set())
            if per_language[language] > 1:
                regions |= set(COMMON_REGIONS)
            regional |= {(form, region) for form in language_forms(language) for region in regions}
    by_tag: dict[str, list[str]] = {}

    def matches(key: str) -> list[str]:  # standard_matches reads a code as its standard tag: fra-latn is fr
        try:
            tag = langcodes.standardize_tag(key)
        except ValueError:
            return []
        if tag not in by_tag:
            by_tag[tag] = standard_matches(tag, known)
        return by_tag[tag]

    model_scripts = {lang.maximize().script for lang in parsed.values()}
    for language, scripts in languages.items():
        forms = language_forms(language)
        scripts |= likely.get(language, (set(), set()))[0]
        if any(matches(form) for form in forms):  # a language near a model code: in another script, maybe another
            scripts |= model_scripts  # (bs-Cyrl is Serbian)
        tags = forms | {f"{form}-{script}" for form in forms for script in scripts}
        plain |= tags
        if any(matches(tag) for tag in tags):  # the regions that change its script (sr-ME: Latin, Croatian)
            regional |= {(form, region) for form in forms for region in likely.get(language, (set(), set()))[1]}
    out = {}
    for key in sorted(normalized(c) for c in plain):
        if found := matches(key):
            out[key] = found
    for form, region in sorted(regional):
        key = normalized(f"{form}-{region}")
        if (found := matches(key)) != out.get(region_dropped(key), matches(region_dropped(key))):
            out[key] = found
    return out


# ISO 639-2's codes for no one language (multiple, undetermined, none, uncoded): valid tags, but naming no pair
NOT_A_LANGUAGE = frozenset({"mul", "und", "zxx", "mis"})


def is_language_code(code: object) -> bool:
    """Whether a code names one language: a BCP-47 tag or an ISO 639 code (en, de-AT, eng, fra_Latn)."""
    import langcodes

    return isinstance(code, str) and langcodes.tag_is_valid(code) and \
        code.replace("_", "-").split("-")[0].lower() not in NOT_A_LANGUAGE


@dataclass(frozen=True)
class TargetLanguage:
    source: Ids = ()  # before the source pieces (Marian's >>fra<<)
    decoder: Ids = ()  # forced after the decoder's start id (M2M100's __fr__)


@dataclass(frozen=True)
class Languages:
    source: Mapping[str, Ids] = field(default_factory=dict)
    target: Mapping[str, TargetLanguage] = field(default_factory=dict)
    default_source: str | None = None
    default_target: str | None = None

    def pick(self, side: str, code: str | None) -> str | None:
        """The code a request means on `side` ("source"/"target"): its own, or the model code a standard one
        means (standard_matches), else the default; a BadInput that lists the valid codes when it is unknown,
        names the candidates when ambiguous, or says it is missing where the model needs one. A model needs one where
        its languages have source tokens, or decoder tokens to force; Marian's and MADLAD's target-language tokens
        go into the source, where their users may also type them (">>fra<< text", "<2fr> text"), so they may be
        left out, and MADLAD's source languages have no tokens."""
        known = self.source if side == "source" else self.target
        code = code or (self.default_source if side == "source" else self.default_target)
        if code is None:
            needed = any(self.source.values()) if side == "source" else any(t.decoder for t in self.target.values())
            if needed:
                raise MissingLanguage(side, known)
            return None
        if code not in known:
            matches = standard_matches(code, known)
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise BadInput(f"ambiguous {side} language {code!r}: it may be {' or '.join(matches)}; name one of "
                               "them")
            have = f"this model has {', '.join(sorted(known))}" if known else f"this model has no {side} languages"
            raise BadInput(f"unknown {side} language {code!r}: {have}")
        return code

    def named(self, source: str | None = None, target: str | None = None) -> Languages:
        """These languages with a bilingual model's pair named: a side named becomes that one language, which adds
        no token and is the default (an Argos package's shape), in place of what the side had. A BadInput where a
        code names no language, or the side's languages are the model's own tokens (M2M100's __fr__, Marian's
        >>fra<<), which a name cannot replace."""
        languages = self
        for side, code in (("source", source), ("target", target)):
            if code is None:
                continue
            option = MissingLanguage.OPTIONS[side]
            if not is_language_code(code):
                raise BadInput(f"{option} {code!r} is not one language's code: give a BCP-47 tag or an ISO 639 "
                               "code (en, de-AT, fra)")
            known = self.source if side == "source" else self.target
            tokens = self.source.values() if side == "source" else \
                [t.source + t.decoder for t in self.target.values()]
            if any(tokens):
                listed = ", ".join(sorted(known)[:5]) + (", ..." if len(known) > 5 else "")
                raise BadInput(f"{option} names a bilingual model's {side} language; this model's {side} languages "
                               f"are its own tokens ({listed}): leave {option} out, and name one when translating")
            if side == "source":
                languages = dataclasses.replace(languages, source={code: ()}, default_source=code)
            else:
                languages = dataclasses.replace(languages, target={code: TargetLanguage()}, default_target=code)
        return languages

    def to_json(self) -> dict[str, Any]:
        out = {"source": {c: list(ids) for c, ids in self.source.items()},
               "target": {c: {"source": list(t.source), "decoder": list(t.decoder)} for c, t in self.target.items()},
               "default_source": self.default_source, "default_target": self.default_target}
        # For consumers without langcodes (Python asks standard_matches). One table for both sides, each consumer
        # keeping the codes of its side: exact where a side has the other's codes or none (every family imported).
        if codes := {*self.source, *self.target}:
            out["aliases"] = standard_aliases(codes)
        return out


@dataclass(frozen=True)
class TokenizerSpec:
    source_model: str
    target_model: str
    source_suffix: Ids
    drop_ids: Ids
    unk_id: int
    source_vocab: str | None = None
    target_vocab: str | None = None
    special_pieces: tuple[str, ...] = ()
    languages: Languages = Languages()
    kind: str = "sentencepiece"
    trailing_space: Ids = ()
    detokenize: str = "sentencepiece"
    moses: tuple[str, str] | None = None  # moses-bpe: the (source, target) languages of Moses' rules

    @classmethod
    def sentencepiece(cls, file: str, pad: int, unk: int, bos: int, eos: int) -> TokenizerSpec:
        """One SentencePiece model whose ids are the model's (the seeds; schema 2's `tokenizer` file)."""
        return cls(source_model=file, target_model=file, source_suffix=(eos,), drop_ids=(pad, unk, bos, eos),
                   unk_id=unk)

    def files(self) -> list[str]:
        names = [self.source_model, self.target_model, self.source_vocab, self.target_vocab]
        return list(dict.fromkeys(n for n in names if n is not None))

    def decoder_prefix(self, tgt_lang: str | None) -> Ids:
        """The tokens forced on the decoder after its start id for a target language (M2M100's __fr__)."""
        code = self.languages.pick("target", tgt_lang)
        return self.languages.target[code].decoder if code else ()

    def renamed(self, names: Mapping[str, str]) -> TokenizerSpec:
        """The same spec with its files renamed (a checkpoint's files as an artifact stores them)."""
        def rename(n: str | None) -> str | None:
            return None if n is None else names.get(n, n)
        return dataclasses.replace(self, source_model=rename(self.source_model), target_model=rename(self.target_model),
                                   source_vocab=rename(self.source_vocab), target_vocab=rename(self.target_vocab))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "source_model": self.source_model, "target_model": self.target_model,
                "source_vocab": self.source_vocab, "target_vocab": self.target_vocab,
                "source_suffix": list(self.source_suffix), "special_pieces": list(self.special_pieces),
                "drop_ids": list(self.drop_ids), "unk_id": self.unk_id, "trailing_space": list(self.trailing_space),
                "languages": self.languages.to_json(), **({"detokenize": self.detokenize}
                                                          if self.detokenize != "sentencepiece" else {}),
                **({"moses": list(self.moses)} if self.moses is not None else {})}

    @classmethod
    def parse(cls, data: Any, where: str, vocab: tuple[int, int]) -> TokenizerSpec:
        """The section as JSON gives it; every problem is one BadArtifact. `vocab`: the model's (source, target)
        vocabulary sizes, which every id must be below."""
        def bad(what: str) -> BadArtifact:
            return BadArtifact(f"{where}: malformed manifest (tokenizer: {what})")

        def file(key: str, optional: bool = False) -> str | None:
            name = data.get(key)
            if name is None and optional:
                return None
            if not isinstance(name, str):
                raise bad(f"{key} is {name!r:.40}")
            return safe_name(name, where)

        def ids(value: Any, what: str, side: int = 0) -> Ids:
            if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      and 0 <= i < vocab[side] for i in value):
                raise bad(f"{what} must be a list of ids below {vocab[side]}, got {value!r:.60}")
            return tuple(value)

        if not isinstance(data, dict):
            raise bad(f"expected an object, got {type(data).__name__}")
        langs = data.get("languages") or {}
        if not isinstance(langs, dict) or not isinstance(langs.get("source", {}), dict) \
                or not isinstance(langs.get("target", {}), dict):
            raise bad("languages must hold source and target objects")
        target = {}
        for code, entry in langs.get("target", {}).items():
            if not isinstance(entry, dict):
                raise bad(f"languages.target.{code} must be an object")
            target[code] = TargetLanguage(ids(entry.get("source", []), f"languages.target.{code}.source"),
                                          ids(entry.get("decoder", []), f"languages.target.{code}.decoder", 1))
        source = {code: ids(v, f"languages.source.{code}") for code, v in langs.get("source", {}).items()}
        # optional (older artifacts have none); Python does not read it: standard_matches gives the same
        aliases = langs.get("aliases", {})
        if not isinstance(aliases, dict) or not all(isinstance(v, list) and all(
                isinstance(c, str) and (c in source or c in target) for c in v) for v in aliases.values()):
            raise bad("languages.aliases must map codes to lists of the model's codes")
        defaults = [langs.get("default_source"), langs.get("default_target")]
        for d, known in zip(defaults, (source, target)):
            if d is not None and (not isinstance(d, str) or d not in known):
                raise bad(f"default language {d!r:.20} is not one of its languages")
        pieces = data.get("special_pieces", [])
        if not isinstance(pieces, list) or not all(isinstance(p, str) and p for p in pieces):
            raise bad("special_pieces must be a list of non-empty strings")
        unk = data.get("unk_id")
        kind = data.get("kind", "sentencepiece")
        if kind not in KINDS:
            raise bad(f"kind {kind!r:.30} is not one of {', '.join(KINDS)}")
        detokenize = data.get("detokenize", "sentencepiece")
        if detokenize not in DETOKENIZERS:
            raise bad(f"detokenize {detokenize!r:.30} is not one of {', '.join(DETOKENIZERS)}")
        moses = data.get("moses")
        if (kind == "moses-bpe") != (moses is not None) or moses is not None and not (
                isinstance(moses, list) and len(moses) == 2 and all(isinstance(c, str) and c for c in moses)):
            raise bad(f"moses must be [source language, target language] for kind moses-bpe (and only then), got "
                      f"{moses!r:.40}")
        return cls(kind=kind, source_model=file("source_model"), target_model=file("target_model"),
                   source_vocab=file("source_vocab", True), target_vocab=file("target_vocab", True),
                   source_suffix=ids(data.get("source_suffix"), "source_suffix"),
                   drop_ids=ids(data.get("drop_ids"), "drop_ids", 1),
                   unk_id=ids([unk], "unk_id")[0], special_pieces=tuple(pieces),
                   trailing_space=ids(data.get("trailing_space", []), "trailing_space"),
                   languages=Languages(source, target, *defaults), detokenize=detokenize,
                   moses=tuple(moses) if moses is not None else None)


__all__ = ["TokenizerSpec", "Languages", "TargetLanguage", "MissingLanguage", "is_language_code"]
