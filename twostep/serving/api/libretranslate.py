"""LibreTranslate's API, for the clients that speak it (its web UI, libretranslatepy and the other client
libraries, the editor, chat and CMS plugins built on it), beside twostep's own:

    POST /translate   q (a text, or a list of texts), source, target, format (text or html), alternatives,
                      api_key; as JSON or form-encoded -> {"translatedText": ..., ["alternatives": ...]}
    GET  /languages   [{"code": "fr", "name": "French", "targets": ["en", ...]}, ...]

As LibreTranslate does: each text is a document, split into sentences; codes are standard tags (fr, zh-Hans, and
its own zt and pb), which mean the model's own codes (Languages.pick); `alternatives` are the next best of an
n-best beam search (each sentence's k-th best, joined); format html translates the text nodes and keeps the
tags. Errors are LibreTranslate's shape, {"error": message}: 400 for a bad request (and, as LibreTranslate, for
one over the size limits), 403 for an api_key that is not one of the server's, 429 while the queue is full, 503
while loading or shutting down. `source: auto` needs a language detector, which this server does not have: 400
(except for a model that takes no source language). A model that names no languages (a bilingual Marian)
translates its one pair whatever `source` and `target` say. With API keys, /translate takes the key as `api_key` or
as the Bearer header; /languages is open, as in LibreTranslate.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from twostep.errors import BadInput, Overloaded, TwostepError
from twostep.runtime.markup import parse_html
from twostep.serving.middleware import bearer_key, known_key
from twostep.serving.service import NotReady, Refused, Service, described, error, until_disconnected

PATHS = frozenset({"/translate", "/languages"})
ALIASES = {"zt": "zh-Hant", "pb": "pt-BR"}  # LibreTranslate's own codes (its libretranslate/language.py)
REFUSED = Refused({NotReady: 503, Overloaded: 429, TwostepError: 400})


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
            raise BadInput("Invalid JSON format: send a JSON object, or form fields") from None
        if not isinstance(body, dict):
            raise BadInput("Invalid JSON format: send a JSON object, or form fields")
        return body
    return dict(await request.form())


def check_key(service: Service, request: Request, body: dict) -> None:
    digests = service.config.api_key_digests
    if not digests:
        return
    given = body.get("api_key")
    key = given.encode() if isinstance(given, str) and given else bearer_key(request.scope)
    if key is None:
        raise KeyRefused("Invalid request: this server needs an API key: send it as api_key (or in the header "
                         "Authorization: Bearer KEY); ask the server's operator for one", 400)
    if not known_key(digests, key):
        raise KeyRefused("Invalid API key", 403)


def languages_of(service: Service) -> list[dict]:
    """GET /languages: each source language the model takes, by its standard tag where it has one, with the
    targets it translates to. A model without source codes lists none (it takes any source text)."""
    tokenizer = service.running().tokenizer
    languages = tokenizer.spec.languages if tokenizer else None
    if languages is None:
        return []
    public = {code: described(code) for code in [*languages.source, *languages.target]}
    tags = [d["tag"] for d in public.values() if d["tag"]]
    for code, d in public.items():  # a tag two codes share is no name for either: the model's code it is
        if not d["tag"] or tags.count(d["tag"]) > 1:
            public[code] = {**d, "tag": code}
    targets = [public[code]["tag"] for code in sorted(languages.target)]
    return [{"code": public[code]["tag"], "name": public[code]["name"] or code, "targets": targets}
            for code in sorted(languages.source)]


def language(value, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"Invalid request: missing {name} parameter")
    return ALIASES.get(value.strip().lower(), value.strip())


def router(service: Service) -> APIRouter:
    routes = APIRouter(tags=["LibreTranslate"])

    @routes.get("/languages")
    async def languages():
        try:
            return languages_of(service)
        except TwostepError as exc:
            return REFUSED.response(service, exc)

    @routes.post("/translate")
    async def translate(request: Request):
        try:
            body = await fields(request)
            check_key(service, request, body)
            future, finished, answer = prepare(body)
        except KeyRefused as exc:
            return error(exc.status, str(exc))
        except TwostepError as exc:
            return REFUSED.response(service, exc)
        try:
            results = await until_disconnected(asyncio.wrap_future(future), request)
        except TwostepError as exc:
            return error(400, str(exc))
        if results is None:  # the client went away; its rows were dropped
            return Response(status_code=499)
        return JSONResponse(answer(await finished(results)))

    def prepare(body: dict):
        """Check and queue a request: (the future of its sentences' hypotheses, what makes the answer of them)."""
        q = body.get("q")
        one = isinstance(q, str)
        texts = [q] if one else q
        if not q or not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise BadInput("Invalid request: missing q parameter (a text, or a list of texts)")
        source, target = language(body.get("source"), "source"), language(body.get("target"), "target")
        markup = body.get("format") or "text"
        if markup not in ("text", "html"):
            raise BadInput(f"{markup} format is not supported: format text or html")
        try:
            alternatives = max(0, int(body.get("alternatives") or 0))
        except (TypeError, ValueError):
            raise BadInput("Invalid request: alternatives parameter is not a number") from None
        translator = service.running()
        tokenizer = translator.tokenizer
        known = tokenizer.spec.languages if tokenizer else None
        if source == "auto" and known and known.source:
            raise BadInput("source auto needs a language detector, which this server does not have: name the "
                           "source language (GET /languages lists them)")
        # a model that names no languages (a bilingual one) translates its one pair, whatever the codes say
        source = source if known and known.source else None
        target = target if known and known.target else None
        service.check_size(texts)
        if markup == "html":  # the text nodes of every text, in order
            fragments = [parse_html(text) for text in texts]
            nodes = [node for fragment in fragments for node in fragment.sources()]
            alternatives = 0  # as LibreTranslate: none for html
        else:
            nodes = texts
        options = translator.translator.options
        if alternatives:
            options = replace(options, beam_size=max(options.beam_size, alternatives + 1), n_best=alternatives + 1)
        sources, plan = service.encode(nodes, source, target)
        future = service.submit(sources, options, target)

        async def finished(results):
            return await translator.replace_unknowns_async(sources, results, options, target)

        def answer(results) -> dict:
            decode = translator.translator.text
            ranked = [[decode(h) for h in hyps] for hyps in results]  # per sentence, best first
            best = plan.join([r[0] if r else "" for r in ranked])
            if markup == "html":
                out, at = [], 0
                for fragment in fragments:
                    n = len(fragment.texts)
                    out.append(fragment.join(best[at : at + n]))
                    at += n
                best = out
            answer = {"translatedText": best[0] if one else best}
            if alternatives:
                others = [plan.join([r[min(k, len(r) - 1)] if r else "" for r in ranked])
                          for k in range(1, alternatives + 1)]
                per_text = [list(dict.fromkeys(alt[i] for alt in others if alt[i] != best[i]))
                            for i in range(len(texts))]
                answer["alternatives"] = per_text[0] if one else per_text
            return answer

        return future, finished, answer

    return routes
