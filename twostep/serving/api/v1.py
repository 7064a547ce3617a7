"""twostep's own API:

    POST /v1/translate   {"text": [...]} or {"ids": [[...], ...]}, with decoding options -> hypotheses;
                         with "stream": true, server-sent events as the translations decode (`events`)
    GET  /v1/languages   the languages a request may name (one model: its own codes), their standard tags and
                         names, each source's targets (those reached through the pivot marked), the models
    POST /v1/glossaries, GET /v1/glossaries[/ID[/entries]], DELETE /v1/glossaries/ID
                         stored glossaries in DeepL's shape (twostep.serving.glossaries), which /v1/translate
                         uses by `glossary_id` (or a request's own: `glossary`)

A request goes to the model that has its pair, or through the pivot language (twostep.serving.models);
`src_lang: auto` detects each text's language (the answer's `detected`), its texts then routed by language.

Bad JSON or fields: 400 {"error": ...}; too many texts, sentences or characters, or too much work: 413; a client
over its requests a minute (--req-limit, its key's): 429 with Retry-After; queue full or shutting down: 503 with
Retry-After; a client gone before its answer: its rows leave the batch (499 logged); a
bug: 500 {"error": ...} (twostep.serving.middleware.ServerErrors), or in a stream its `error` event. The API
document states each option's range and the languages a request may name (`describe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Literal, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from twostep.artifact.tokenizer import MissingLanguage
from twostep.errors import BadInput, TwostepError
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.decoding.options import BEAM_STOPS, BOUNDS
from twostep.runtime.documents import DocumentPlan
from twostep.runtime.glossary import MAX_ENTRIES, MAX_TERM_CHARS, Entry, Glossary, Terms, parse_entries
from twostep.runtime.streaming import Delta, Event, SentenceDone, TextDone, TextEvents
from twostep.serving.api import refusals
from twostep.serving.glossaries import UnknownGlossary, check_pair, pair_of
from twostep.serving.middleware import bearer_key, internal_error
from twostep.serving.models import Catalog, Route, Unsupported, described
from twostep.serving.service import (
    FAILED,
    V1_REFUSED,
    OverLimit,
    Service,
    Translated,
    error,
    term_json,
    until_disconnected,
)

log = logging.getLogger("twostep.serving")


class Term(BaseModel):
    """A glossary entry: a source term and the target terms that may translate it (any one of them)."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(description=f"A term (at most {MAX_TERM_CHARS} characters) of the source language.")
    targets: list[str] = Field(description=f"Its translations (each at most {MAX_TERM_CHARS} characters): the "
                               "output holds one of them, as written.")


class TranslateRequest(BaseModel):
    """Sentences as text, or as token ids (each ending with eos), and how to decode them."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [  # exactly one of text and ids
        {"required": ["text"], "properties": {"text": {"type": "array"}}},
        {"required": ["ids"], "properties": {"ids": {"type": "array"}}}]})
    text: Optional[list[str]] = Field(None, description="Texts to translate: each a document, split into sentences "
                                      "(unless split is false), or a sentence; each with something besides white "
                                      "space. All of them together hold at most the server's characters a request "
                                      "(maxLength), and at most its sentences a request (maxItems; 413 beyond).")
    ids: Optional[list[list[int]]] = Field(None, description="Token ids instead of text, each ending with eos, "
                                           "within the model's vocabulary and max_positions.")
    stream: bool = Field(False, description="Answer with server-sent events (text/event-stream) as the sentences "
                         "decode: delta (greedy, sampling), sentence, text, then end (or error).")
    split: bool = Field(True, description="Split each text into sentences, translate them as rows of the batch and "
                        "join them with the text's own whitespace and line breaks; false: each text is one sentence.")
    # Decoding options: each one left out (or null) is the model's default (its manifest's decoding section),
    # else twostep's (shown). Their ranges are the API document's (`describe`), checked by DecodeOptions and the
    # server's admission, whose messages say what was got and what is allowed.
    beam: Optional[int] = Field(None, description="Beam size; 1 (greedy) unless the model says otherwise. At most "
                                "the server's max_beam and max_batch_rows.")
    n_best: Optional[int] = Field(None, description="Hypotheses per text (1); at most the beam size.")
    length_penalty: Optional[float] = Field(None, description="Beam scores: log-probability / length ** this (1.0).")
    max_new_tokens: Optional[int] = Field(None, description="Default: 2 x source length + 16. At most the server's "
                                          "max_new_tokens and the model's max_positions.")
    min_new_tokens: Optional[int] = Field(None, description="No eos before this many tokens (0).")
    sampling: Optional[bool] = Field(None, description="Sample instead of searching (false); not with a beam above "
                                     "1.")
    temperature: Optional[float] = Field(None, description="Sampling temperature (1.0).")
    top_k: Optional[int] = Field(None, description="Sample from the k most likely tokens (0: all).")
    top_p: Optional[float] = Field(None, description="Sample from the smallest set of tokens of this mass (1.0).")
    seed: Optional[int] = None
    suppress_eos: Optional[bool] = Field(None, description="Never end at eos: max_new_tokens tokens each "
                                         "(benchmarks).")
    beam_stop: Optional[str] = Field(None, description="Beam search's stopping rule: n_best (twostep's), "
                                     "transformers (as its generate() stops: keeps beam finished hypotheses; "
                                     "transformers_early, transformers_never: with early_stopping true, \"never\"), "
                                     "or ctranslate2 (as CTranslate2's beam search, Argos Translate's engine).")
    no_repeat_ngram_size: Optional[int] = Field(None, description="Never repeat an n-gram of this size "
                                                "(transformers' no_repeat_ngram_size; 0: no such rule).")
    replace_unknowns: Optional[bool] = Field(None, description="Replace each <unk> by the source piece it attends "
                                             "to most (CTranslate2's replace_unknowns; false unless the model says "
                                             "otherwise, as an Argos package does).")
    src_lang: Optional[str] = Field(None, description="Source language: the model's code (M2M100: en; NLLB: "
                                    "eng_Latn; mBART-50: en_XX) or a standard one (en, eng, en-US); auto: each "
                                    "text's, detected (the answer's `detected`). The API document of a running "
                                    "server lists its models' codes and standard tags (GET /v1/languages); other "
                                    "spellings of a standard code are taken too. Null only, for a model that names "
                                    "no source languages.")
    tgt_lang: Optional[str] = Field(None, description="Target language: the model's code (M2M100: fr; NLLB: "
                                    "fra_Latn; mBART-50: fr_XX; Marian: fra for >>fra<<) or a standard one (fr, "
                                    "fra, fr-FR), listed as src_lang's are.")
    glossary: Optional[list[Term]] = Field(None, max_length=MAX_ENTRIES, description="A glossary of the request's "
                                           "own: each source term found in a sentence (at word boundaries) is "
                                           "translated as one of its targets, forced by constrained beam search "
                                           "(at least beam 4). The answer's applied_terms and unmet_terms say "
                                           "which were. Not with sampling, nor with glossary_id.")
    glossary_ignore_case: bool = Field(False, description="Find the glossary's source terms whatever their case.")
    glossary_id: Optional[str] = Field(None, description="A stored glossary (POST /v1/glossaries) of this "
                                       "request's language pair, instead of glossary.")

    def options(self, translator, last: bool = True) -> DecodeOptions:
        """The request's options over the model's defaults (translator: a BatchingTranslator); a pivot's first leg
        (not `last`) keeps one hypothesis a sentence."""
        if not last:
            return replace(self.options(translator), n_best=1)
        return translator.options_with(
            beam_size=self.beam, n_best=self.n_best, length_penalty=self.length_penalty,
            max_new_tokens=self.max_new_tokens, min_new_tokens=self.min_new_tokens, sampling=self.sampling,
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
            suppress_eos=self.suppress_eos, beam_stop=self.beam_stop, no_repeat_ngram_size=self.no_repeat_ngram_size,
            replace_unknowns=self.replace_unknowns)


class GlossaryRequest(BaseModel):
    """A glossary to store, as DeepL's API takes one."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "numbers", "source_lang": "en", "target_lang": "de", "entries": "seven\tsieben\nthousand\ttausend\n",
        "entries_format": "tsv"}]})
    name: str = Field(description="What to call it.")
    source_lang: str = Field(description="Its source language, as /v1/translate's src_lang names it.")
    target_lang: str = Field(description="Its target language, as /v1/translate's tgt_lang names it.")
    entries: str = Field(description=f"One entry a line: a source term, then its target (further fields: further "
                         f"targets, any one of which may translate it), at most {MAX_ENTRIES} entries, each term at "
                         f"most {MAX_TERM_CHARS} characters.")
    entries_format: Literal["tsv", "csv"] = Field("tsv", description="tsv: fields separated by a tab; csv: by a "
                                                  "comma (RFC 4180 quoting).")


class GlossaryInfo(BaseModel):
    glossary_id: str
    name: str
    ready: bool = Field(description="Always true: a glossary is ready once it is stored.")
    source_lang: str = Field(description="A standard tag, or the code as given where the model names none.")
    target_lang: str
    creation_time: str = Field(description="ISO 8601, UTC.")
    entry_count: int


class GlossaryList(BaseModel):
    glossaries: list[GlossaryInfo]


class Sentence(BaseModel):
    text: str
    tokens: list[int]
    score: float


class Hypothesis(BaseModel):
    text: Optional[str] = Field(None, description="Absent for requests sent as ids.")
    tokens: Optional[list[int]] = Field(None, description="Absent for a text of several sentences: see sentences.")
    score: float = Field(description="Length-normalized log-probability (beam search; 0 otherwise); for a text of "
                         "several sentences, their mean.")
    sentences: Optional[list[Sentence]] = Field(None, description="A text of several sentences: each one's best.")


class Detected(BaseModel):
    language: str
    confidence: float = Field(description="0-100")


class TranslateResponse(BaseModel):
    translations: list[list[Hypothesis]] = Field(description="Per text (or ids), in request order: its n_best "
                                                 "hypotheses; a text of several sentences has one, its sentences' "
                                                 "best joined. Through a pivot: the second model's.")
    detected: Optional[list[Detected]] = Field(None, description="With src_lang auto: each text's language.")
    applied_terms: Optional[list[list[Term]]] = Field(None, description="With a glossary: per text, the terms "
                                                      "found in it that its translation holds.")
    unmet_terms: Optional[list[list[Term]]] = Field(None, description="With a glossary: per text, the terms found "
                                                    "in it that its translation does not hold (a sentence reached "
                                                    "its max_new_tokens first, or the target term has no "
                                                    "tokenization the model can write).")


def hypotheses(done: Translated) -> list[list[dict]]:
    """Each text's hypotheses from its sentences' (DocumentPlan.join_nbest's rule: a one-sentence text keeps its
    n-best, in its whitespace; a text of several sentences has one, their best joined), with the tokens of a
    one-sentence text's, or each sentence's best."""
    plan, results = done.plan, done.results
    texts = [[(text, h.score) for text, h in zip(ranked, hyps)] for ranked, hyps in zip(done.ranked, results)]
    out = []
    for joined, part, part_texts in zip(plan.join_nbest(texts), plan.parts(results), plan.parts(texts)):
        if len(part) == 1:
            out.append([{"text": t, "tokens": h.tokens, "score": s} for (t, s), h in zip(joined, part[0])])
        else:
            sentences = [{"text": ts[0][0], "tokens": hyps[0].tokens, "score": hyps[0].score}
                         for hyps, ts in zip(part, part_texts)]
            out.append([{"text": t, "score": s, "sentences": sentences} for t, s in joined])
    return out


def language_list(catalog: Catalog) -> dict:
    """GET /v1/languages: the languages a request may name, each source with the targets it translates to
    (`pivoted`: those reached through the pivot language), and each model's. One model: its own codes (a request
    may also name them by a standard code, see twostep.artifact.tokenizer.standard_matches); a model without
    source codes takes its source text as it is, one without target codes (a bilingual Marian) translates to its
    one language. Several: each language by its standard tag (twostep.serving.models)."""
    single = catalog.single
    models = [{"name": m.name, "source": sorted({m.names[c] for c in m.sources}),
               "target": sorted({m.names[c] for c in m.targets})} for m in catalog.models]
    if single is not None:
        languages = single.languages
        if languages is None:
            return {"source": [], "target": [], "default_source": None, "default_target": None, "models": models}
        targets = sorted(languages.target)
        return {"source": [{**described(code), "targets": targets, "pivoted": []} for code in sorted(languages.source)],
                "target": [described(code) for code in targets],
                "default_source": languages.default_source, "default_target": languages.default_target,
                "models": models}
    reachable = catalog.reachable()
    targets = sorted({t for direct, pivoted in reachable.values() for t in (*direct, *pivoted)})
    return {"source": [{**described(tag), "code": tag, "targets": sorted({*direct, *pivoted}), "pivoted": pivoted}
                       for tag, (direct, pivoted) in reachable.items()],
            "target": [{**described(tag), "code": tag} for tag in targets],
            "default_source": None, "default_target": None, "models": models}


async def events(stream: AsyncIterator[Event], plan: DocumentPlan, service: Service,
                 release: Callable[[], None] = lambda: None,
                 terms: list[Terms | None] | None = None) -> AsyncIterator[dict]:
    """A stream's server-sent events, each's data a JSON object (`text`: the text's index in the request,
    `sentence`: the sentence's in its text): `delta` {text, sentence, delta} as a sentence's translation grows
    (greedy search and sampling: its deltas joined are its translation); `sentence` {text, sentence,
    translation, score, hypotheses} once it is done; `text` {text, translation} once a text's sentences are all
    done, joined with its whitespace (with a glossary, each sentence's `terms`: its applied_terms and unmet_terms
    too); `end` {} last; or `error` {error} if decoding fails. A client that goes away has the stream closed and its
    rows dropped. `release()` once it ends (the model it lent)."""
    try:
        async for event in sse_events(stream, plan, service, terms):
            yield event
    finally:
        release()


async def sse_events(stream: AsyncIterator[Event], plan: DocumentPlan, service: Service,
                     terms: list[Terms | None] | None = None) -> AsyncIterator[dict]:
    """`events`' events. Any exception ends the stream with an `error` event: a refusal (TwostepError, raised while
    decoding: an engine profile's limit, say) or a decode's fault (engine.Faulted, logged where it happened) in its
    own words; anything else, a bug, with its traceback logged once here and its type told (internal_error). A
    stream never just breaks off."""
    where = [(t, j) for t, doc in enumerate(plan.documents) for j in range(len(doc.sentences))]
    firsts = [0]
    for doc in plan.documents:
        firsts.append(firsts[-1] + len(doc.sentences))
    unmet: dict[int, tuple[int, ...]] = {}  # each sentence done's unmet constraint terms
    started, first = time.perf_counter(), True
    try:
        async with contextlib.aclosing(stream):
            async for event in stream:
                if first:
                    service.metrics.first_event.observe(time.perf_counter() - started)
                    first = False
                if isinstance(event, Delta):
                    t, j = where[event.sentence]
                    yield sse("delta", {"text": t, "sentence": j, "delta": event.text})
                elif isinstance(event, SentenceDone):
                    unmet[event.sentence] = event.unmet
                    t, j = where[event.sentence]
                    yield sse("sentence", {"text": t, "sentence": j, "translation": event.text,
                                           "score": event.hypotheses[0][1] if event.hypotheses else 0.0,
                                           "hypotheses": [{"text": h, "score": s} for h, s in event.hypotheses]})
                elif isinstance(event, TextDone):
                    data = {"text": event.text, "translation": event.translation}
                    if terms is not None:
                        data.update(text_terms(terms, unmet, range(firsts[event.text], firsts[event.text + 1])))
                    yield sse("text", data)
    except FAILED as exc:  # raised while decoding: an engine profile's limit, a fault (logged where it happened)
        yield sse("error", {"error": str(exc)})
        return
    except Exception as exc:
        log.exception("a stream failed: %s", internal_error(exc))
        yield sse("error", {"error": internal_error(exc)})
        return
    yield sse("end", {})


def entries_of(body: TranslateRequest) -> list[Entry] | None:
    """The request's own glossary's entries (Entry checks each: an empty term, one over MAX_TERM_CHARS)."""
    if body.glossary is None:
        return None
    return [Entry(term.source, tuple(term.targets), body.glossary_ignore_case) for term in body.glossary]


def text_terms(terms: list[Terms | None], unmet: dict[int, tuple[int, ...]], sentences) -> dict[str, list[dict]]:
    """A streamed text's applied_terms and unmet_terms, from its `sentences`' terms and what each's best missed."""
    applied, missed = [], []
    for i in sentences:
        if terms[i] is not None:
            a, u = terms[i].outcome(unmet.get(i, ()))
            applied += map(term_json, a)
            missed += map(term_json, u)
    return {"applied_terms": applied, "unmet_terms": missed}


def sse(event: str, data: dict) -> dict:
    return {"event": event, "data": json.dumps(data, ensure_ascii=False)}


def event_schema(name: str, fields: dict[str, dict], description: str, optional: dict[str, dict] | None = None) -> dict:
    """One kind of `events`' server-sent events, as JSON Schema describes an event of a text/event-stream (its
    fields event and data; data a JSON object of `fields`, and of `optional` where they apply)."""
    return {"type": "object", "required": ["event", "data"], "description": description, "properties": {
        "event": {"const": name},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"type": "object", "required": list(fields),
                                   "properties": {**fields, **(optional or {})}}}}}


INDEX, TEXT, SCORE = {"type": "integer", "minimum": 0}, {"type": "string"}, {"type": "number"}
TERMS = {"type": "array", "items": {"type": "object", "required": ["source", "targets"], "properties": {
    "source": TEXT, "targets": {"type": "array", "items": TEXT}}}}
STREAM_EVENT = {"oneOf": [  # `events`
    event_schema("delta", {"text": INDEX, "sentence": INDEX, "delta": TEXT},
                 "A sentence's translation grows (greedy search, sampling)"),
    event_schema("sentence", {"text": INDEX, "sentence": INDEX, "translation": TEXT, "score": SCORE, "hypotheses": {
        "type": "array", "items": {"type": "object", "properties": {"text": TEXT, "score": SCORE}}}},
        "A sentence is done"),
    event_schema("text", {"text": INDEX, "translation": TEXT}, "A text's sentences are all done (with a glossary, "
                 "its applied_terms and unmet_terms)", {name: TERMS for name in ("applied_terms", "unmet_terms")}),
    event_schema("end", {}, "The last event"),
    event_schema("error", {"error": TEXT}, "The last event of a stream that failed")]}


FIELDS = {"beam_size": "beam"}  # the request's names for DecodeOptions' fields that it spells otherwise


def option_ranges(service: Service) -> dict[str, dict]:
    """Each bounded decoding option's range as JSON Schema states it, by request field: its BOUNDS, narrowed by
    the server's own limits: beam and n_best by the beam limit (BatchLimits.beam_limit), max_new_tokens by
    `new_tokens_limit`."""
    tighter = {"beam_size": service.config.limits.beam_limit, "n_best": service.config.limits.beam_limit,
               "max_new_tokens": new_tokens_limit(service)}
    out = {}
    for name, bound in BOUNDS.items():
        high = bound.high if tighter.get(name) is None else min(bound.high, tighter[name])
        out[FIELDS.get(name, name)] = {"exclusiveMinimum" if bound.low_open else "minimum": bound.low, "maximum": high}
    return out


def model_limits(service: Service) -> list | None:
    """The limits of every model's translator (twostep.runtime.translator's Limits: max_positions, vocab_size),
    once the server runs with all of them loaded; None before, or while some are not (max_loaded, Ray's loader)."""
    pool, catalog = service.pool, service.catalog
    if not service.ready or pool is None or catalog is None or len(pool.loaded) != len(catalog.models):
        return None
    return [entry.translator.translator.limits for entry in pool.loaded.values()]


def new_tokens_limit(service: Service) -> int | None:
    """The most new tokens a sentence may ask for: the server's max_new_tokens, at most a model's max_positions
    and its engine profile's target positions (the most of them, each model refusing beyond its own) where they
    are known (model_limits); None: no limit but BOUNDS'."""
    limits, models = service.config.limits, model_limits(service)
    if models:
        return max(min(limits.new_tokens(model.max_positions), model.target_positions) for model in models)
    return limits.max_new_tokens


def request_codes(catalog: Catalog, side: str) -> list[str]:
    """The language codes a request may name on `side` ("source", "target"): each model's own and their standard
    tags, and auto for a source where the server detects languages; none where a one-model server's model names
    no languages on that side (it takes no code there)."""
    codes = {"auto"} if side == "source" and catalog.source_tags() else set()
    for m in catalog.models:
        own = m.sources if side == "source" else m.targets
        codes |= {*own, *(m.names[c] for c in own)}
    return sorted(codes)


def describe(document: dict, service: Service) -> None:
    """State in the API document (twostep.serving.http's) what TranslateRequest's schema cannot know: each
    decoding option's range (`option_ranges`) and beam_stop's choices; text's and ids' sizes (the server's
    max_sentences and max_chars; the models' vocabulary and max_positions once known); once the models are open,
    the language codes a request may name."""
    config = service.config
    fields = document["components"]["schemas"]["TranslateRequest"]["properties"]
    for name, constraints in option_ranges(service).items():
        narrow(fields[name], constraints)
    narrow(fields["beam_stop"], {"enum": list(BEAM_STOPS)})
    narrow(fields["text"], {"maxItems": config.max_sentences,
                            "items": {"type": "string", "pattern": r"\S", "maxLength": config.max_chars}})
    models = model_limits(service)
    token = {"type": "integer", "minimum": 0, **({"maximum": max(m.vocab_size for m in models) - 1} if models else {})}
    positions = max(m.max_positions for m in models) if models else config.max_chars
    narrow(fields["ids"], {"maxItems": config.max_sentences,
                           "items": {"type": "array", "minItems": 1, "maxItems": min(positions, config.max_chars),
                                     "items": token}})
    if service.ready:
        for name, side in (("src_lang", "source"), ("tgt_lang", "target")):
            codes = request_codes(service.catalog, side)
            if codes:
                narrow(fields[name], {"enum": codes})
            else:
                fields[name]["anyOf"] = [{"type": "null"}]


def narrow(field: dict, constraints: dict) -> None:
    """Add JSON Schema `constraints` to a field of pydantic's schema: to its branch that is not null where the
    field is Optional (anyOf [X, null])."""
    for branch in field.get("anyOf", [field]):
        if branch.get("type") != "null":
            branch.update(constraints)


def router(service: Service) -> APIRouter:
    routes = APIRouter(prefix="/v1", tags=["twostep"])

    @routes.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
                 responses={200: {"content": {"text/event-stream": {"schema": STREAM_EVENT}},
                                  "description": "The translations; with stream, server-sent events as they decode: "
                                  "delta, sentence, text, then end (or error)"},
                            **refusals({400: "Bad JSON, fields or input", 413: "Too large: more texts, sentences "
                                        "or characters than the server takes, or too much work (sentences x beam x "
                                        "new tokens)", 429: "Over the client's requests a minute; see Retry-After",
                                        503: "Loading, queue full or shutting down; see "
                                        "Retry-After"})})
    async def translate(body: TranslateRequest, request: Request):
        if (body.text is None) == (body.ids is None):
            return error(400, "bad request: give either text or ids")
        try:
            catalog = service.running()
            given = body.text if body.text is not None else body.ids
            key = bearer_key(request.scope) if service.config.keyed else None  # RequireKey let it in
            chars = service.admit(request.scope, key, key and service.key_limits(key), cost=len(given))
            service.check_batch(given)
            if body.text is not None:
                service.check_size(body.text, limit=chars)
            glossary, stored = service.glossary(key, entries_of(body), body.glossary_id)
            if glossary is not None and body.ids is not None:
                raise BadInput("bad request: a glossary finds its terms in text: it does not go with ids")
            if glossary is not None and body.sampling:
                raise BadInput("a glossary needs beam search or greedy decoding, not sampling")
            groups, detected = await plan(catalog, body)
            for route, _ in groups if stored is not None else ():
                check_pair(stored.id, (stored.source_lang, stored.target_lang),
                           pair_of(route, body.src_lang, body.tgt_lang))
            if body.stream or body.ids is not None:
                if body.stream and body.text is None:
                    return error(400, "bad request: stream takes text, not ids")
                if len(groups) != 1 or len(groups[0][0].legs) != 1:
                    what = "stream" if body.stream else "ids"
                    raise BadInput(f"bad request: {what} needs one model for the request: its texts' languages "
                                   "route to several, or through the pivot language (or need none)")
                return await direct(groups[0][0], body, request, chars, glossary)
            done = await asyncio.gather(*(service.translate([body.text[i] for i in where], route, body.options,
                                                            body.split, request, chars, glossary)
                                          for route, where in groups))
        except MissingLanguage as exc:  # named as the request's field, not the CLI's option
            return error(400, exc.worded(MissingLanguage.FIELDS[exc.side]))
        except Unsupported as exc:  # in twostep's words, which list the codes
            return error(400, exc.plain)
        except FAILED as exc:
            return V1_REFUSED.response(service, exc)
        out: list = [None] * len(body.text)
        terms: list = [None] * len(body.text)
        for (_, where), translated in zip(groups, done):
            if translated is None:  # the client went away; its rows were dropped
                return Response(status_code=499)
            for i, hyps, text_terms in zip(where, hypotheses(translated), translated.text_terms()):
                out[i], terms[i] = hyps, text_terms
        # TranslateResponse's shape, built as plain JSON: validating our own output per request buys nothing
        answer = {"translations": out, **({"detected": detected} if detected is not None else {})}
        if glossary is not None:
            answer["applied_terms"] = [t["applied_terms"] for t in terms]
            answer["unmet_terms"] = [t["unmet_terms"] for t in terms]
        return JSONResponse(answer)

    async def plan(catalog: Catalog, body: TranslateRequest) -> tuple[list[tuple[Route, list[int]]], list | None]:
        """The routes of a request's texts (or ids), each with the indices of its texts, and what was detected of
        each text (None unless src_lang is auto)."""
        count = len(body.text if body.text is not None else body.ids)
        if body.src_lang != "auto" or not catalog.source_tags():
            return [(catalog.route(body.src_lang, body.tgt_lang), list(range(count)))], None
        if body.text is None:
            raise BadInput("bad request: src_lang auto takes text, not ids")
        found, by_source = await service.sources_of(body.text, "src_lang")
        detected = [{"language": tag, "confidence": float(confidence)} for tag, confidence in found]
        return [(catalog.route(tag, body.tgt_lang), where) for tag, where in by_source.items()], detected

    async def direct(route: Route, body: TranslateRequest, request: Request, chars: int,
                     glossary: Glossary | None = None):
        """A request for one model's engine itself: token ids, or a stream (with `glossary`'s terms, found in its
        sentences: Service.translate's); `chars`: the characters (or ids) the client's request may hold."""
        leg = route.legs[0]
        entry = await service.pool.acquire(leg.model)
        translator = entry.translator
        try:
            options = body.options(translator)
            if body.text is not None:
                sources, plan = service.encode(translator, body.text, leg.source, leg.target, body.split, chars)
            else:
                service.check_size(body.ids, "token ids", chars)
                sources = body.ids
            if body.stream:
                service.check_sentences(len(sources))
                terms = translator.translator.sentence_terms(plan.sentences, glossary) if glossary else None
                constraints = [t.constraints if t else None for t in terms] if terms else None
                stream = translator.stream_ids_async(sources, options, leg.target, TextEvents(plan), constraints)
                released, entry = entry, None  # the stream's end releases it
                return EventSourceResponse(events(stream, plan, service, lambda: service.pool.release(released),
                                                  terms), ping=15, shutdown_grace_period=55)
            future = service.submit(translator, sources, options, leg.target)
            try:
                results = await until_disconnected(asyncio.wrap_future(future), request)
            except FAILED as exc:  # raised while decoding: an engine profile's limit, a fault
                return V1_REFUSED.response(service, exc)
            if results is None:  # the client went away; its rows were dropped
                return Response(status_code=499)
            results = await translator.replace_unknowns_async(sources, results, options, leg.target)
            return JSONResponse({"translations": [[{"tokens": h.tokens, "score": h.score} for h in hyps]
                                                  for hyps in results]})
        finally:
            if entry is not None:
                service.pool.release(entry)

    def owner(request: Request) -> bytes:
        return service.owner(bearer_key(request.scope) if service.config.keyed else None)  # RequireKey let it in

    @routes.post("/glossaries", status_code=201, response_model=GlossaryInfo,
                 responses=refusals({400: "Bad JSON, fields, entries or languages", 413: "Entries longer than the "
                                     "server takes", 503: "Loading or shutting down; see Retry-After"}))
    async def create_glossary(body: GlossaryRequest, request: Request):
        """Store a glossary (DeepL's POST /v2/glossaries): its entries one a line, a source term then its target
        (further fields: further targets), separated by a tab (tsv) or a comma (csv)."""
        try:
            if len(body.entries) > service.config.file_size_limit:
                raise OverLimit(f"the glossary's entries hold {len(body.entries)} characters; at most "
                                f"{service.config.file_size_limit}", len(body.entries), service.config.file_size_limit)
            route = service.running().route(body.source_lang, body.target_lang, lenient=True)
            source, target = pair_of(route, body.source_lang, body.target_lang)
            if source is not None and source == target:
                raise BadInput(f"a glossary translates between two languages; got {source} on both sides")
            entries = parse_entries(body.entries, body.entries_format)
            stored = await asyncio.to_thread(service.glossaries.create, owner(request), body.name,
                                             source or body.source_lang, target or body.target_lang, entries)
        except Unsupported as exc:
            return error(400, exc.plain)
        except TwostepError as exc:
            return V1_REFUSED.response(service, exc)
        return JSONResponse(stored.described(), status_code=201)

    @routes.get("/glossaries", response_model=GlossaryList)
    async def list_glossaries(request: Request):
        """The glossaries stored (with API keys: the key's own)."""
        return {"glossaries": [g.described() for g in await asyncio.to_thread(service.glossaries.all,
                                                                                owner(request))]}

    unknown = refusals({404: "No glossary of this id (with API keys: of this key)"})

    @routes.get("/glossaries/{glossary_id}", response_model=GlossaryInfo, responses=unknown)
    async def glossary_info(glossary_id: str, request: Request):
        try:
            return (await asyncio.to_thread(service.glossaries.get, owner(request), glossary_id)).described()
        except UnknownGlossary as exc:
            return error(404, str(exc))

    @routes.get("/glossaries/{glossary_id}/entries", response_class=PlainTextResponse, responses={
        200: {"content": {"text/tab-separated-values": {"schema": {"type": "string"}}},
              "description": "The entries, one a line: the source term, a tab, its targets separated by tabs"},
        404: {"description": unknown[404]["description"],  # JSON, not the route's text
              "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}})
    async def glossary_entries(glossary_id: str, request: Request):
        try:
            stored = await asyncio.to_thread(service.glossaries.get, owner(request), glossary_id)
        except UnknownGlossary as exc:
            return error(404, str(exc))
        return PlainTextResponse(stored.tsv(), media_type="text/tab-separated-values; charset=utf-8")

    @routes.delete("/glossaries/{glossary_id}", status_code=204, response_class=Response,
                   responses={204: {"description": "Deleted"}, **unknown})
    async def delete_glossary(glossary_id: str, request: Request):
        try:
            await asyncio.to_thread(service.glossaries.delete, owner(request), glossary_id)
        except UnknownGlossary as exc:
            return error(404, str(exc))
        return Response(status_code=204)

    @routes.get("/languages", responses=refusals({503: "Loading or shutting down; see Retry-After"}))
    async def languages():
        try:
            return language_list(service.running())
        except TwostepError as exc:
            return V1_REFUSED.response(service, exc)

    return routes
