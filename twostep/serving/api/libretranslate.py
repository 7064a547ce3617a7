"""LibreTranslate's API, for the clients that speak it (its web UI and browser extensions, libretranslatepy and the
other client libraries, Mastodon, Weblate, the editor, chat and CMS plugins built on it), beside twostep's own:

    POST /translate          q (a text, or a list of texts), source (or auto), target, format (text or html),
                             alternatives, api_key; as JSON or form-encoded -> {"translatedText": ...,
                             ["alternatives": ...], ["detectedLanguage": ...]}
    POST /detect             q (a text or a list) -> [{"language": "fr", "confidence": 92.0}, ...], best first
    GET  /languages          [{"code": "en", "name": "English", "targets": ["en", "fr", ...]}, ...]
    GET  /frontend/settings  what LibreTranslate's web UI reads: charLimit, keyRequired, the default languages, ...
    POST /suggest            q, s (the suggested translation), source, target -> {"success": true}; with
                             --suggestions (else 403), stored in SQLite (twostep.serving.suggestions)
    GET  /health             {"status": "ok"}
    GET  /spec               the OpenAPI document

As LibreTranslate (its libretranslate/app.py and tests/test_api define the behaviour): each text is a document,
split into sentences; codes are standard tags (fr, zh-Hans, and its own zt and pb) resolved to the models' codes
(twostep.serving.models routes the pair to a model, or through the pivot language); `alternatives` are the next best
of an n-best beam search (each sentence's k-th best, joined), none for html; format html translates the text nodes
and keeps the tags; a text with nothing to translate (no letter or digit: an emoji, punctuation) comes back as it
came. /languages lists what LibreTranslate lists (argostranslate's installed languages): every language a model
translates from or into, English first, then by name, each with every target it reaches, itself included (the text
as it came) and through the pivot. /detect and `source: auto` detect among all of them, as LibreTranslate: a text in
a language the server only translates into is translated to that language alone (as it came), to any other it is
LibreTranslate's 400 "English (en) is not available as a target language from French (fr)". LibreTranslate detects
one language for a whole list: here each text has its own, so `detectedLanguage` is a list for a list. Errors are
LibreTranslate's shape, {"error": message}, in its words where its tests or app.py have them: 400 for a bad request
(and, as LibreTranslate, for one over the size limits: "Invalid request: request (N) exceeds text limit (M)" for
the characters and the texts), 403 for an api_key that is not one of the server's, 429 while the queue is full or a
client is over its requests a minute ("Slowdown: 60 per 1 minute"), 503 while loading or shutting down; 405 for a
wrong method; 500 for a bug. With API keys, /translate and /detect take the key as `api_key` or as the Bearer
header; the other paths are open, as in LibreTranslate. The API document states what /translate and /detect
take, as JSON and as forms (`describe`).
"""

from __future__ import annotations

import asyncio
import functools
import html
import os
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.datastructures import UploadFile

from twostep.errors import BadInput, Overloaded, TooLarge, TwostepError
from twostep.runtime import files
from twostep.runtime.glossary import Entry, Glossary, parse_entries
from twostep.runtime.markup import parse_html
from twostep.serving.api import refusals
from twostep.serving.downloads import NAME, Downloads, download_name
from twostep.serving.engine import Faulted
from twostep.serving.glossaries import check_pair, pair_of
from twostep.serving.keys import KeyLimits
from twostep.serving.middleware import bearer_key
from twostep.serving.models import Catalog, Route, Unsupported, described
from twostep.serving.service import (
    FAILED,
    NotReady,
    OverLimit,
    RateLimited,
    Refused,
    ServeConfig,
    Service,
    Translated,
    error,
)
from twostep.serving.suggestions import CODE, Suggestions

PATHS = frozenset({"/translate", "/detect", "/translate_file"})  # which check their key themselves (body or header)
# open with keys, as LibreTranslate's (FOLDER/*: every path under FOLDER/; middleware.is_open)
OPEN = frozenset({"/languages", "/frontend/settings", "/health", "/spec", "/suggest", "/download_file/*"})
ALIASES = {"zt": "zh-Hant", "pb": "pt-BR"}  # LibreTranslate's own codes (its libretranslate/language.py)
REFUSED = Refused({Faulted: 500, NotReady: 503, Overloaded: 429, RateLimited: 429, TwostepError: 400}, {
    # LibreTranslate's words (its app.py: flask-limiter's limit after its "Slowdown:"; its size limits')
    RateLimited: lambda exc: f"Slowdown: {exc.limit}",
    OverLimit: lambda exc: f"Invalid request: request ({exc.size}) exceeds text limit ({exc.limit})"})
FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default --frontend-timeout


class FileTooLarge(TooLarge):
    """An uploaded file over the server's file_size_limit (413)."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"Invalid request: file size ({size} bytes) exceeds the file size limit ({limit} bytes)")


class KeyRefused(TwostepError):
    """A request without a key to a server that has keys (400, as LibreTranslate), or with a wrong one (403)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


async def fields(request: Request) -> dict:
    """The request's fields, from a JSON object or a form (urlencoded or multipart)."""
    if "json" in request.headers.get("content-type", ""):
        try:
            body = await request.json()
        except ValueError:
            raise BadInput("Invalid JSON format") from None
        if not isinstance(body, dict):
            raise BadInput("Invalid JSON format")
        return body
    return dict(await request.form())


def check_key(service: Service, request: Request, body: dict) -> tuple[bytes | None, KeyLimits | None]:
    """The request's key (api_key, or the Bearer header) and its limits (Service.key_limits); (None, None) on a
    server without keys."""
    if not service.config.keyed:
        return None, None
    given = body.get("api_key")
    key = given.encode() if isinstance(given, str) and given else bearer_key(request.scope)
    if key is None:
        raise KeyRefused("Invalid request: this server needs an API key: send it as api_key (or in the header "
                         "Authorization: Bearer KEY); ask the server's operator for one", 400)
    limits = service.key_limits(key)
    if limits is None:
        raise KeyRefused("Invalid API key", 403)
    return key, limits


def admitted(service: Service, request: Request, body: dict, cost: int = 1) -> int:
    """The request's key checked (check_key) and the request counted against its client's requests a minute
    (Service.admit; `cost`: a list's texts for /translate, as LibreTranslate counts them): the characters it may
    hold."""
    key, limits = check_key(service, request, body)
    return service.admit(request.scope, key, limits, cost)


def texts_of(body: dict) -> tuple[list[str], bool]:
    """`q`: (its texts, whether it was one text)."""
    q = body.get("q")
    if not q:
        raise BadInput("Invalid request: missing q parameter")
    if isinstance(q, str):
        return [q], True
    if not isinstance(q, list) or not all(isinstance(t, str) for t in q):
        raise BadInput("Invalid request: q must be a text or a list of texts")
    return q, False


def language(value, name: str) -> str:
    """A code as LibreTranslate reads it: lowercase (its iso2model)."""
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"Invalid request: missing {name} parameter")
    return value.strip().lower()


def routed(catalog: Catalog, source: str, target: str) -> Route:
    """The route of a pair of LibreTranslate's codes (its zt and pb mean zh-Hant and pt-BR); a code no model has
    is refused as LibreTranslate words it, naming the code as the request gave it."""
    try:
        return catalog.route(ALIASES.get(source, source), ALIASES.get(target, target), lenient=True)
    except Unsupported as exc:
        if exc.side is None:
            raise
        raise Unsupported(f"{source if exc.side == 'source' else target} is not supported") from None


def glossary_entries(body: dict) -> list[Entry] | None:
    """twostep's `glossary` field: TSV (a form's fields are text: one entry a line, a source term, a tab, its
    target), or in a JSON body also a list of {"source", "targets"} as /v1/translate takes it; with
    `glossary_ignore_case` (true or false) its terms are found whatever their case. None: not given."""
    given = body.get("glossary")
    if given is None or given == "":
        return None
    ignore_case = body.get("glossary_ignore_case", False)
    if isinstance(ignore_case, str) and ignore_case.strip().lower() in ("true", "false", "1", "0", ""):
        ignore_case = ignore_case.strip().lower() in ("true", "1")
    if not isinstance(ignore_case, bool):
        raise BadInput("Invalid request: glossary_ignore_case must be true or false")
    if isinstance(given, str):
        return parse_entries(given, "tsv", ignore_case)
    if isinstance(given, list) and all(
            isinstance(e, dict) and set(e) == {"source", "targets"} and isinstance(e["source"], str)
            and isinstance(e["targets"], list) and all(isinstance(t, str) for t in e["targets"]) for e in given):
        return [Entry(e["source"], tuple(e["targets"]), ignore_case) for e in given]
    raise BadInput('Invalid request: glossary must be TSV text (a source term, a tab, its target; one a line) or '
                   'a list of {"source": text, "targets": [text, ...]}')


def translatable(text: str) -> bool:
    """Whether a text has anything to translate: a letter or a digit (not only emoji, punctuation, spaces)."""
    return any(ch.isalnum() for ch in text)


@dataclass(frozen=True)
class Ask:
    """A /translate request, parsed and checked in LibreTranslate's order (q, source, target, alternatives,
    format)."""

    texts: list[str]
    one: bool
    source: str
    target: str
    markup: str
    alternatives: int  # asked for: html answers an empty list each, as LibreTranslate

    @classmethod
    def of(cls, body: dict, most_alternatives: int, why: str = "") -> Ask:
        """`most_alternatives`: the server's limit (`alternatives_limit`), as LibreTranslate's --alternatives-limit;
        `why`: what the refusal adds to LibreTranslate's words."""
        texts, one = texts_of(body)
        source, target = language(body.get("source"), "source"), language(body.get("target"), "target")
        try:
            alternatives = max(0, int(body.get("alternatives") or 0))
        except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400, which JSON reads as infinity
            raise BadInput("Invalid request: alternatives parameter is not a number") from None
        if alternatives > most_alternatives:
            raise BadInput(f"Invalid request: alternatives parameter must be <= {most_alternatives}{why}")
        markup = body.get("format") or "text"
        if markup not in ("text", "html"):
            raise BadInput(f"{markup} format is not supported")
        return cls(texts, one, source, target, markup, alternatives)

    @functools.cached_property
    def fragments(self) -> list | None:
        """Each html text parsed, once (None for format text); read after the size checks."""
        return [parse_html(text) for text in self.texts] if self.markup == "html" else None

    def words(self, i: int) -> str:
        """What text i's language is detected from, and whether it has anything to translate: its text nodes for
        html."""
        return " ".join(self.fragments[i].sources()) if self.fragments else self.texts[i]


def alternatives_limit(config: ServeConfig) -> tuple[int, str]:
    """The most alternatives a request may ask for, and why where LibreTranslate's words do not say: the server's
    --alternatives-limit, and at most the beam limit - 1 (a translation and its alternatives are one beam's
    best, and a beam is at most BatchLimits.beam_limit)."""
    beam = config.limits.beam_limit
    if config.alternatives_limit is not None and config.alternatives_limit < beam:
        return config.alternatives_limit, ""
    return beam - 1, (f" (a translation and its alternatives are one beam search's best, and the server's beam limit "
                      f"is {beam}: twostep serve --max-beam and --max-batch-rows)")


TERMS = {"type": "array", "items": {"type": "object", "required": ["source", "targets"], "properties": {
    "source": {"type": "string"}, "targets": {"type": "array", "items": {"type": "string"}}}}}
GLOSSARY_FIELDS = {  # twostep's own (LibreTranslate has none): a request's glossary, or a stored one's id
    "glossary": {"anyOf": [{"type": "string"}, TERMS], "description": "twostep's: a glossary, as TSV (one entry a "
                 "line: a source term, a tab, its target; further fields further targets) or, in a JSON body, a "
                 "list of {source, targets}. The answer then has applied_terms and unmet_terms."},
    "glossary_id": {"type": "string", "description": "twostep's: a stored glossary (POST /v1/glossaries) of "
                    "the request's language pair, instead of glossary."},
    "glossary_ignore_case": {"type": "boolean", "default": False, "description": "twostep's: find the glossary's "
                             "terms whatever their case."}}


def request_bodies(config: ServeConfig) -> tuple[dict, dict, dict]:
    """The request bodies of /translate, /detect and /suggest: a JSON object, or a form (urlencoded or multipart),
    whose q is one text (a form's only kind) or a list (not /suggest's); the size limits are the server's (its
    max_chars, max_sentences)."""
    def text(**limits) -> dict:
        return {"type": "string", "maxLength": config.max_chars, **limits}

    def q(most: int | None) -> dict:
        texts = {"type": "array", "minItems": 1, "items": text(), **({"maxItems": most} if most else {})}
        return {"anyOf": [text(minLength=1), texts], "description": "A text, or a list of texts (each a document; "
                "all of them together at most the server's characters a request, the charLimit of "
                "/frontend/settings)."}

    api_key = {"type": "string", "description": "One of the server's API keys, where it has them (or send "
               "Authorization: Bearer KEY)."}
    code = {"type": "string", "pattern": r"\S", "description": "A language code of GET /languages (any case), "
            "or LibreTranslate's zt (zh-Hant) and pb (pt-BR)."}
    translate = {"q": q(config.max_sentences), "source": {**code, "description": code["description"] + " auto: "
                 "each text's, detected (the answer's detectedLanguage)."}, "target": code,
                 "format": {"type": "string", "enum": ["text", "html"], "default": "text", "description": "html: "
                            "the text nodes are translated, the tags kept."},
                 "alternatives": {"type": "integer", "minimum": 0, "maximum": alternatives_limit(config)[0],
                                  "default": 0, "description": "How many other translations to answer (none for "
                                  "html)."},
                 "api_key": api_key, **GLOSSARY_FIELDS}
    detect = {"q": q(None), "api_key": api_key}
    tag = {"type": "string", "pattern": r"^\s*[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*\s*$", "description": "A language "
           "code, stored lower-cased."}
    suggest = {"q": text(minLength=1, description="The text translated."), "s": text(minLength=1, description=(
        "The translation suggested (q and s together at most the server's characters a request).")),
        "source": tag, "target": tag}

    def body(fields: dict, required: list[str]) -> dict:
        form = {"type": "object", "properties": {**fields, **{name: fields[name].get("anyOf", [fields[name]])[0]
                                                              for name in ("q", "glossary") if name in fields}},
                "required": required}
        return {"required": True, "content": {
            "application/json": {"schema": {"type": "object", "properties": fields, "required": required}},
            "application/x-www-form-urlencoded": {"schema": form}, "multipart/form-data": {"schema": form}}}

    return (body(translate, ["q", "source", "target"]), body(detect, ["q"]),
            body(suggest, ["q", "s", "source", "target"]))


def describe(document: dict, service: Service) -> None:
    """State in the API document (twostep.serving.http's) what /translate and /detect take, which FastAPI cannot
    see (their routes parse their bodies themselves, in `fields`): `request_bodies`; once the models are open, the
    language codes /translate takes: on each side every language GET /languages lists (a language is a source
    and a target of itself), LibreTranslate's aliases of them, and auto for a source where the server detects;
    where a one-model server's model names no languages on a side, the codes of its other side, and any code on
    that one (it translates its one pair whatever the code says)."""
    paths = document["paths"]
    for parameter in paths["/download_file/{name}"]["get"]["parameters"]:  # the names the server makes
        parameter["schema"]["pattern"] = f"^{NAME.pattern}$"
    paths["/translate"]["post"]["requestBody"], paths["/detect"]["post"]["requestBody"], \
        paths["/suggest"]["post"]["requestBody"] = request_bodies(service.config)
    if not service.ready:
        return
    catalog = service.running()
    for side in ("source", "target"):
        tags = set(catalog.languages()) or {m.names[c] for m in catalog.models
                                            for c in (m.sources if side == "source" else m.targets)}
        if not tags:
            continue
        codes = tags | {alias for alias, tag in ALIASES.items() if tag in tags}
        codes |= {"auto"} if side == "source" else set()
        for content in paths["/translate"]["post"]["requestBody"]["content"].values():
            content["schema"]["properties"][side] = {**content["schema"]["properties"][side], "enum": sorted(codes)}


def languages_of(service: Service) -> list[dict]:
    """GET /languages: `listed`."""
    return listed(service.running())


def listed(catalog: Catalog) -> list[dict]:
    """The languages as LibreTranslate lists argostranslate's installed languages (its app.py langs(), 1.9.6):
    every language a model translates from or into, by its standard tag where it has one, English first, then by
    name; each with every target a request from it reaches (Catalog.languages: itself, its models' targets, those
    through the pivot), in the order of LibreTranslate's own codes (pb, zh and zt for pt-BR, zh-Hans and zh-Hant).
    A lone model that names no languages on a side lists none (it takes any code there)."""
    languages = catalog.languages()
    names = {tag: described(tag)["name"] or tag for tag in languages}
    return [{"code": tag, "name": names[tag], "targets": sorted(languages[tag], key=own_code)}
            for tag in sorted(languages, key=lambda tag: (tag != "en", names[tag], tag))]


def own_code(tag: str) -> str:
    """LibreTranslate's code for a standard tag (its iso2model): lower case, its own for pt-BR, zh-Hans, zh-Hant."""
    tag = tag.lower()
    return {"pt-br": "pb", "zh-hans": "zh", "zh-hant": "zt"}.get(tag, tag)


def settings_of(service: Service) -> dict:
    """GET /frontend/settings, in LibreTranslate's shape: what its web UI needs before its first request."""
    catalog = service.running()
    reachable = catalog.reachable()
    sources = list(reachable)
    auto = len(sources) > 1
    source = "auto" if auto else (sources[0] if sources else "auto")
    targets = sorted({t for direct, pivoted in reachable.values() for t in (*direct, *pivoted)})
    target = next((t for t in targets if t != source and t != catalog.pivot), targets[0] if targets else "")
    keys = service.config.keyed  # a key is needed wherever there are keys (LibreTranslate: with an origin's)
    return {"charLimit": service.config.max_chars, "frontendTimeout": FRONTEND_TIMEOUT_MS, "apiKeys": keys,
            "keyRequired": keys, "suggestions": service.config.suggestions is not None,
            "filesTranslation": service.config.files_translation,
            "supportedFilesFormat": list(files.FORMATS) if service.config.files_translation else [],
            "language": {"source": {"code": source, "name": "Auto Detect" if source == "auto"
                                    else described(source)["name"] or source},
                         "target": {"code": target, "name": described(target)["name"] or target}}}


DETECTED = {"type": "object", "properties": {"confidence": {"type": "number", "description": "0-100"},
                                             "language": {"type": "string"}}}


def answers(schema: dict, refused: dict[int, str] | None = None) -> dict:
    """A route's `responses`: its answer's JSON schema, and its refusals."""
    return {200: {"content": {"application/json": {"schema": schema}}}, **refusals(refused or {})}


def router(service: Service) -> APIRouter:
    routes = APIRouter(tags=["LibreTranslate"])
    most_alternatives, why = alternatives_limit(service.config)
    loading = {503: "Loading or shutting down; see Retry-After"}
    refused = {400: "A bad request, or one over the size limits", 403: "An api_key that is not one of the "
               "server's", 429: "The queue is full, or the client is over its requests a minute; see Retry-After",
               **loading}

    def described_by(of):
        """What `of(service)` says of the server, or the refusal while it loads or shuts down."""
        try:
            return of(service)
        except TwostepError as exc:
            return REFUSED.response(service, exc)

    @routes.get("/languages", responses=answers({"type": "array", "items": {"type": "object", "properties": {
        "code": {"type": "string"}, "name": {"type": "string"},
        "targets": {"type": "array", "items": {"type": "string"}}}}}, loading))
    async def languages():
        return described_by(languages_of)

    @routes.get("/frontend/settings", responses=answers({"type": "object"}, loading))
    async def frontend_settings():
        return described_by(settings_of)

    @routes.get("/health", responses=answers({"type": "object", "properties": {"status": {"type": "string"}}}))
    async def health():
        return {"status": "ok"}

    @routes.get("/spec", responses=answers({"type": "object", "description": "This OpenAPI document"}))
    async def spec(request: Request):
        return request.app.openapi()

    suggestions = Suggestions(service.config.suggestions) if service.config.suggestions else None

    @routes.post("/suggest", responses=answers({"type": "object", "properties": {"success": {"type": "boolean"}}},
                                               {400: refused[400], 403: "Suggestions are off on this server"}))
    async def suggest(request: Request):
        """Store a suggested translation `s` of `q`, as LibreTranslate does (its codes lower-cased, as given)."""
        if suggestions is None:
            return error(403, "Suggestions are disabled on this server.")
        try:
            body = await fields(request)
            for name in ("q", "s"):
                if not isinstance(body.get(name), str) or not body[name]:
                    raise BadInput(f"Invalid request: missing {name} parameter")
            source, target = language(body.get("source"), "source"), language(body.get("target"), "target")
            for code in (source, target):
                if not CODE.fullmatch(code):
                    raise BadInput(f"Invalid request: {code} is not a language code")
            service.check_size([body["q"], body["s"]])
        except TwostepError as exc:
            return REFUSED.response(service, exc)
        await asyncio.to_thread(suggestions.add, body["q"], body["s"], source, target)
        return JSONResponse({"success": True})

    @routes.post("/detect",
                  responses=answers({"type": "array", "items": DETECTED, "description": "Best first"},
                                    {status: refused[status] for status in (400, 403, 429, 503)}))
    async def detect(request: Request):
        try:
            body = await fields(request)
            chars = admitted(service, request, body)
            texts, _ = texts_of(body)
            service.check_size(texts, limit=chars)
            found = await service.detect(texts, list(service.running().languages()))
        except KeyRefused as exc:
            return error(exc.status, str(exc))
        except TwostepError as exc:
            return REFUSED.response(service, exc)
        return JSONResponse(ranked_languages(found, service.running().source_tags()))

    @routes.post("/translate", responses=answers({
        "type": "object", "required": ["translatedText"], "properties": {
            "translatedText": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "alternatives": {"type": "array", "items": {"anyOf": [{"type": "string"},
                                                                  {"type": "array", "items": {"type": "string"}}]}},
            "detectedLanguage": {"anyOf": [DETECTED, {"type": "array", "items": DETECTED}]},
            **{name: {"anyOf": [TERMS, {"type": "array", "items": TERMS}], "description": f"twostep's, with a "
                      f"glossary: the terms found in the text {what} (for a list of texts, a list per text)"}
               for name, what in (("applied_terms", "that its translation holds"),
                                  ("unmet_terms", "that its translation does not hold"))}}}, refused))
    async def translate(request: Request):
        try:
            body = await fields(request)
            q = body.get("q")
            key, limits = check_key(service, request, body)
            chars = service.admit(request.scope, key, limits, cost=max(1, len(q)) if isinstance(q, list) else 1)
            ask = Ask.of(body, most_alternatives, why)
            service.check_batch(ask.texts)  # LibreTranslate's order: the texts, then their characters
            service.check_size(ask.texts, limit=chars)
            glossary_id = body.get("glossary_id") or None
            if glossary_id is not None and not isinstance(glossary_id, str):
                raise BadInput("Invalid request: glossary_id must be a text")
            glossary, stored = service.glossary(key, glossary_entries(body), glossary_id)
            groups, detected = await plan(ask)
            for route, _ in groups if stored is not None else ():
                check_pair(stored.id, (stored.source_lang, stored.target_lang), pair_of(route, ask.source, ask.target))
        except KeyRefused as exc:
            return error(exc.status, str(exc))
        except TwostepError as exc:
            return REFUSED.response(service, exc)
        out: list = list(ask.texts)  # a text with nothing to translate stays as it came
        alternatives: list[list[str]] = [[] for _ in ask.texts]
        terms = [{"applied_terms": [], "unmet_terms": []} for _ in ask.texts]
        try:
            done = await asyncio.gather(*(translated(ask, route, where, request, chars, glossary)
                                          for route, where in groups))
        except FAILED as exc:  # refused (an over-long sentence, the queue), or failed while decoding
            return REFUSED.response(service, exc)
        for (_, where), answers in zip(groups, done):
            if answers is None:  # the client went away; its rows were dropped
                return Response(status_code=499)
            for i, (text, others, text_terms) in zip(where, answers):
                out[i], alternatives[i], terms[i] = text, others, text_terms
        answer = {"translatedText": out[0] if ask.one else out}
        if ask.alternatives:
            answer["alternatives"] = alternatives[0] if ask.one else alternatives
        if detected is not None:
            answer["detectedLanguage"] = detected[0] if ask.one else detected
        if glossary is not None:  # twostep's own keys, which LibreTranslate's clients ignore
            for name in ("applied_terms", "unmet_terms"):
                answer[name] = terms[0][name] if ask.one else [t[name] for t in terms]
        return JSONResponse(answer)

    async def plan(ask: Ask) -> tuple[list[tuple[Route, list[int]]], list[dict] | None]:
        """The routes of a request's texts, each with the indices of its texts (those with something to
        translate), and what was detected of each text (None unless `source` is auto)."""
        catalog = service.running()
        todo = [i for i in range(len(ask.texts)) if translatable(ask.words(i))]
        detect = ask.source == "auto" and bool(catalog.source_tags())
        if not detect:
            # an unknown code, or a pair without a route, fails the request whole
            route = routed(catalog, ask.source, ask.target)
            return ([(route, todo)] if todo else []), None
        found, by_source = await service.sources_of([ask.words(i) for i in todo], "source", list(catalog.languages()))
        detected = [{"confidence": 0.0, "language": fallback(catalog.source_tags())} for _ in ask.texts]
        for i, (tag, confidence) in zip(todo, found):
            detected[i] = {"confidence": float(confidence), "language": tag}
        return [(routed(catalog, tag, ask.target), [todo[j] for j in where])
                for tag, where in by_source.items()], detected

    async def translated(ask: Ask, route: Route, where: list[int], request: Request, chars: int,
                         glossary: Glossary | None = None) -> list | None:
        """The translation, alternatives and glossary terms (Translated.text_terms) of each text of `where` along
        `route` (None: the client went away); `chars`: the characters the client's request may hold."""
        texts = [ask.texts[i] for i in where]
        fragments = [ask.fragments[i] for i in where] if ask.fragments else None
        nodes = [node for fragment in fragments for node in fragment.sources()] if fragments else texts

        def options(translator, last: bool):
            options = translator.translator.options
            if last and ask.alternatives and not fragments:  # none for html, as LibreTranslate
                n = ask.alternatives + 1
                options = replace(options, beam_size=max(options.beam_size, n), n_best=n)
            return options

        done: Translated | None = await service.translate(nodes, route, options, request=request, max_chars=chars,
                                                          glossary=glossary)
        if done is None:
            return None
        plan = done.plan
        best = plan.join([r[0] if r else "" for r in done.ranked])
        terms = done.text_terms()
        if fragments:
            out, at = [], 0
            for fragment in fragments:
                n = len(fragment.texts)
                mine = terms[at:at + n]
                out.append((fragment.join(best[at:at + n]), [], {
                    name: [term for t in mine for term in t[name]] for name in ("applied_terms", "unmet_terms")}))
                at += n
            return out
        others = [plan.join([r[min(k, len(r) - 1)] if r else "" for r in done.ranked])
                  for k in range(1, ask.alternatives + 1)]
        out = []
        for i, text in enumerate(texts):
            first = formatted(text, best[i])
            alternatives = (formatted(text, alt[i]) for alt in others)
            out.append((first, list(dict.fromkeys(a for a in alternatives if a not in (first, ""))), terms[i]))
        return out

    downloads = Downloads(service.config.files_dir, service.config.files_ttl_s)
    size_limit = service.config.file_size_limit

    @routes.post("/translate_file", responses=answers({
        "type": "object", "required": ["translatedFileUrl"], "properties": {"translatedFileUrl": {
            "type": "string", "description": "Where GET fetches the translated file"}}},
        {**refused, 403: "A wrong api_key, or files translation off on this server", 413: "A file over the "
         "server's size limit (twostep serve --file-size-limit)"}), openapi_extra={"requestBody": {
            "required": True, "content": {"multipart/form-data": {"schema": {
                "type": "object", "required": ["file", "source", "target"], "properties": {
                    "file": {"type": "string", "format": "binary", "description": "A file of a format of "
                             "/frontend/settings' supportedFilesFormat, by its name's suffix"},
                    "source": {"type": "string", "description": "A language code, or auto"},
                    "target": {"type": "string"}, "api_key": {"type": "string"}}}}}}})
    async def translate_file(request: Request):
        """Translate a file (twostep.runtime.files reads and writes it; its text nodes go through /translate's
        path, `file_texts`); the answer names where to download it."""
        if not service.config.files_translation:
            return error(403, "Files translation are disabled on this server.")
        try:
            length = request.headers.get("content-length", "")
            if length.isdigit() and int(length) > size_limit + 64 * 1024:  # refused before its body is read
                raise FileTooLarge(int(length), size_limit)
            body = await fields(request)
            upload = body.get("file")
            size = (upload.size or 0) if isinstance(upload, UploadFile) else 0
            chars = admitted(service, request, body, cost=max(1, size // service.config.max_chars))
            if not isinstance(upload, UploadFile):
                raise BadInput("Invalid request: missing file parameter")
            source, target = language(body.get("source"), "source"), language(body.get("target"), "target")
            if not upload.filename:
                raise BadInput("Invalid request: empty file")
            suffix = os.path.splitext(upload.filename)[1]
            if suffix not in files.FORMATS:
                raise BadInput("Invalid request: file format not supported")
            data = await upload.read(size_limit + 1)
            if len(data) > size_limit:
                raise FileTooLarge(max(size, len(data)), size_limit)
            parsed = await asyncio.to_thread(files.read, data, suffix)
            catalog = service.running()
            if source == "auto" and catalog.source_tags() and parsed.texts:
                _, by_source = await service.sources_of([" ".join(parsed.texts)[:4096]], "source",
                                                        list(catalog.languages()))
                source = next(iter(by_source))
            elif source == "auto" and catalog.source_tags():
                source = fallback(catalog.source_tags())
            route = routed(catalog, source, target)
        except KeyRefused as exc:
            return error(exc.status, str(exc))
        except FileTooLarge as exc:
            return error(413, str(exc))
        except TwostepError as exc:
            return REFUSED.response(service, exc)
        try:
            translations = await file_texts(parsed.texts, route, request, chars)
        except FAILED as exc:
            return REFUSED.response(service, exc)
        if translations is None:  # the client went away
            return Response(status_code=499)
        out = await asyncio.to_thread(parsed.write, translations)
        name = await asyncio.to_thread(downloads.store, out, upload.filename, target)
        return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", name=name))})

    @routes.get("/download_file/{name:path}", responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        **refusals({400: "A name the server does not make", 404: "No such file, or removed (twostep serve "
                    "--files-ttl)"})})
    async def download_file(name: str):
        """A translated file, saved as the name of the upload with the target's code."""
        if not service.config.files_translation:
            return error(400, "Files translation are disabled on this server.")  # LibreTranslate's status
        try:
            path = downloads.path(name)
        except BadInput as exc:
            return error(400, str(exc))
        if path is None:
            return error(404, f"No such file: {name} (a translated file is removed {service.config.files_ttl_s:g} "
                         "s after it was made)")
        return FileResponse(path, filename=download_name(name))

    async def file_texts(texts: list[str], route: Route, request: Request, chars: int) -> list[str] | None:
        """A file's text nodes translated as /translate translates a list of texts (`translated`): all in one
        call where they fit a request's limits (the client's characters, the server's sentences), else in parts,
        one after another; a part over the sentence limit once split is halved. None: the client went away."""
        async def part(texts: list[str]) -> list[str] | None:
            try:
                done = await translated(Ask(texts, False, "", "", "text", 0), route, list(range(len(texts))),
                                        request, chars)
            except TooLarge:
                if len(texts) == 1:
                    raise
                half = len(texts) // 2
                first = await part(texts[:half])
                second = await part(texts[half:]) if first is not None else None
                return None if first is None or second is None else first + second
            return None if done is None else [text for text, *_ in done]

        out: list[str] = []
        for group in parts(texts, chars, service.config.max_sentences):
            done = await part(group)
            if done is None:
                return None
            out += done
        return out

    return routes


def parts(texts: list[str], chars: int, most: int) -> list[list[str]]:
    """Texts in order, in groups of at most `chars` characters (a longer text alone) and `most` texts."""
    groups: list[list[str]] = []
    size = 0
    for text in texts:
        if not groups or len(groups[-1]) >= most or size + len(text) > chars:
            groups.append([])
            size = 0
        groups[-1].append(text)
        size += len(text)
    return groups


def formatted(source: str, translation: str) -> str:
    """A text-format translation as LibreTranslate answers it (its libretranslate/language.py
    improve_translation_formatting, 1.9.6): the source's final punctuation mark in place of the translation's (or
    the translation's dropped where the source has none), a one-word source whose translation repeats one word
    cut to that word (its workaround for models that repeat a word endlessly), the source's case (all lower, all
    upper, or its first letter's); then html entities unescaped, as LibreTranslate does."""
    source = source.strip()
    if not source or not translation:
        return html.unescape(source)
    marks = ["!", "?", ".", ",", ";", "。"]
    if source[-1] in marks:
        if translation[-1] != source[-1]:
            if translation[-1] in marks:
                translation = translation[:-1]
            translation += source[-1]
    elif translation[-1] in marks:
        translation = translation[:-1]
    if len(source) < 20 and source.count(" ") == 0 and translation.count(" ") > 0:
        words = translation.split()
        count: dict[str, int] = {}
        for word in words:
            count[word] = count.get(word, 0) + 1
        if any(n / len(count) >= 2 for n in count.values()):
            translation = words[0]
    if source.islower():
        translation = translation.lower()
    elif source.isupper():
        translation = translation.upper()
    elif source[0].islower():
        translation = translation[0].lower() + translation[1:]
    elif source[0].isupper():
        translation = translation[0].upper() + translation[1:]
    return html.unescape(translation)


def fallback(sources: list[str]) -> str:
    """The language LibreTranslate names, with confidence 0, for a text it cannot detect: English where the
    server translates from it, else its first source language."""
    return "en" if "en" in sources or not sources else sources[0]


def ranked_languages(found: list[list[tuple[str, float]]], sources: list[str]) -> list[dict]:
    """POST /detect's answer for one text or a list (LibreTranslate answers one list for a list): each language
    with its confidence averaged over the texts (0 where a text did not name it), best first; where nothing was
    detected, LibreTranslate's fallback with confidence 0."""
    total: dict[str, float] = {}
    for candidates in found:
        for tag, confidence in candidates:
            total[tag] = total.get(tag, 0.0) + confidence
    if not total:
        return [{"confidence": 0.0, "language": fallback(sources)}]
    ranked = sorted(total.items(), key=lambda kv: -kv[1])
    return [{"confidence": round(value / len(found), 1), "language": tag} for tag, value in ranked]
