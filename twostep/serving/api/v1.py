"""twostep's own API:

    POST /v1/translate   {"text": [...]} or {"ids": [[...], ...]}, with decoding options -> hypotheses;
                         with "stream": true, server-sent events as the translations decode (`events`)
    GET  /v1/languages   the model's language codes, their standard tags and names, each source's targets

Bad JSON or fields: 400 {"error": ...}; too many sentences or characters, or too much work: 413; queue full or
shutting down: 503 with Retry-After; a client gone before its answer: its rows leave the batch (499 logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from twostep.artifact.tokenizer import Languages, MissingLanguage
from twostep.errors import TwostepError
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.documents import DocumentPlan
from twostep.runtime.streaming import Delta, Event, SentenceDone, TextDone, TextEvents
from twostep.serving.service import V1_REFUSED, NotReady, Service, described, error, until_disconnected


class TranslateRequest(BaseModel):
    """Sentences as text, or as token ids (each ending with eos), and how to decode them."""

    model_config = ConfigDict(extra="forbid")
    text: Optional[list[str]] = Field(None, description="Texts to translate: each a document, split into sentences "
                                      "(unless split is false), or a sentence.")
    ids: Optional[list[list[int]]] = Field(None, description="Token ids instead of text, each ending with eos.")
    stream: bool = Field(False, description="Answer with server-sent events (text/event-stream) as the sentences "
                         "decode: delta (greedy, sampling), sentence, text, then end (or error).")
    split: bool = Field(True, description="Split each text into sentences, translate them as rows of the batch and "
                        "join them with the text's own whitespace and line breaks; false: each text is one sentence.")
    # Decoding options: each one left out (or null) is the model's default (its manifest's decoding section),
    # else twostep's (shown)
    beam: Optional[int] = Field(None, description="Beam size; 1 (greedy) unless the model says otherwise.")
    n_best: Optional[int] = Field(None, description="Hypotheses per text (1).")
    length_penalty: Optional[float] = Field(None, description="Beam scores: log-probability / length ** this (1.0).")
    max_new_tokens: Optional[int] = Field(None, description="Default: 2 x source length + 16.")
    min_new_tokens: Optional[int] = Field(None, description="No eos before this many tokens (0).")
    sampling: Optional[bool] = Field(None, description="Sample instead of searching (false).")
    temperature: Optional[float] = Field(None, description="Sampling temperature (1.0).")
    top_k: Optional[int] = Field(None, description="Sample from the k most likely tokens (0: all).")
    top_p: Optional[float] = Field(None, description="Sample from the smallest set of tokens of this mass (1.0).")
    seed: Optional[int] = None
    suppress_eos: Optional[bool] = Field(None, description="Never end at eos: max_new_tokens tokens each "
                                         "(benchmarks).")
    beam_stop: Optional[str] = Field(None, description="Beam search's stopping rule: n_best (twostep's), "
                                     "transformers (as its generate() stops: keeps beam finished hypotheses), or "
                                     "ctranslate2 (as CTranslate2's beam search, Argos Translate's engine).")
    replace_unknowns: Optional[bool] = Field(None, description="Replace each <unk> by the source piece it attends "
                                             "to most (CTranslate2's replace_unknowns; false unless the model says "
                                             "otherwise, as an Argos package does).")
    src_lang: Optional[str] = Field(None, description="Source language: the model's code (M2M100: en; NLLB: "
                                    "eng_Latn; mBART-50: en_XX) or a standard one (en, eng, en-US).")
    tgt_lang: Optional[str] = Field(None, description="Target language: the model's code (M2M100: fr; NLLB: "
                                    "fra_Latn; mBART-50: fr_XX; Marian: fra for >>fra<<) or a standard one (fr, "
                                    "fra, fr-FR).")

    def options(self, translator) -> DecodeOptions:
        """The request's options over the model's defaults (translator: a BatchingTranslator)."""
        return translator.options_with(
            beam_size=self.beam, n_best=self.n_best, length_penalty=self.length_penalty,
            max_new_tokens=self.max_new_tokens, min_new_tokens=self.min_new_tokens, sampling=self.sampling,
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
            suppress_eos=self.suppress_eos, beam_stop=self.beam_stop, replace_unknowns=self.replace_unknowns)


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


class TranslateResponse(BaseModel):
    translations: list[list[Hypothesis]] = Field(description="Per text (or ids), in request order: its n_best "
                                                 "hypotheses; a text of several sentences has one, its sentences' "
                                                 "best joined.")


def hypotheses(plan: DocumentPlan, results: list, decode) -> list[list[dict]]:
    """Each text's hypotheses from its sentences' (DocumentPlan.join_nbest's rule: a one-sentence text keeps its
    n-best, in its whitespace; a text of several sentences has one, their best joined), with the tokens of a
    one-sentence text's, or each sentence's best."""
    texts = [[(decode(h), h.score) for h in hyps] for hyps in results]
    out = []
    for joined, part, part_texts in zip(plan.join_nbest(texts), plan.parts(results), plan.parts(texts)):
        if len(part) == 1:
            out.append([{"text": t, "tokens": h.tokens, "score": s} for (t, s), h in zip(joined, part[0])])
        else:
            sentences = [{"text": ts[0][0], "tokens": hyps[0].tokens, "score": hyps[0].score}
                         for hyps, ts in zip(part, part_texts)]
            out.append([{"text": t, "score": s, "sentences": sentences} for t, s in joined])
    return out


def language_list(languages: Languages | None) -> dict:
    """GET /v1/languages: the codes the model takes (a request may also name them by a standard code, see
    twostep.artifact.tokenizer.standard_matches), each source with the targets it translates to. A model without
    source codes takes its source text as it is; one without target codes (a bilingual Marian) translates to its
    one language."""
    if languages is None:
        return {"source": [], "target": [], "default_source": None, "default_target": None}
    targets = sorted(languages.target)
    return {"source": [{**described(code), "targets": targets} for code in sorted(languages.source)],
            "target": [described(code) for code in targets],
            "default_source": languages.default_source, "default_target": languages.default_target}


async def events(stream: AsyncIterator[Event], plan: DocumentPlan, service: Service) -> AsyncIterator[dict]:
    """A stream's server-sent events, each's data a JSON object (`text`: the text's index in the request,
    `sentence`: the sentence's in its text): `delta` {text, sentence, delta} as a sentence's translation grows
    (greedy search and sampling: its deltas joined are its translation); `sentence` {text, sentence,
    translation, score, hypotheses} once it is done; `text` {text, translation} once a text's sentences are all
    done, joined with its whitespace; `end` {} last; or `error` {error} if decoding fails. A client that goes away
    has the stream closed and its rows dropped."""
    where = [(t, j) for t, doc in enumerate(plan.documents) for j in range(len(doc.sentences))]
    started, first = time.perf_counter(), True
    async with contextlib.aclosing(stream):
        try:
            async for event in stream:
                if first:
                    service.metrics.first_event.observe(time.perf_counter() - started)
                    first = False
                if isinstance(event, Delta):
                    t, j = where[event.sentence]
                    yield sse("delta", {"text": t, "sentence": j, "delta": event.text})
                elif isinstance(event, SentenceDone):
                    t, j = where[event.sentence]
                    yield sse("sentence", {"text": t, "sentence": j, "translation": event.text,
                                           "score": event.hypotheses[0][1] if event.hypotheses else 0.0,
                                           "hypotheses": [{"text": h, "score": s} for h, s in event.hypotheses]})
                elif isinstance(event, TextDone):
                    yield sse("text", {"text": event.text, "translation": event.translation})
        except TwostepError as exc:  # raised while decoding: an engine profile's limit, say
            yield sse("error", {"error": str(exc)})
            return
    yield sse("end", {})


def sse(event: str, data: dict) -> dict:
    return {"event": event, "data": json.dumps(data, ensure_ascii=False)}


def router(service: Service) -> APIRouter:
    routes = APIRouter(prefix="/v1", tags=["twostep"])

    @routes.post("/translate", response_model=TranslateResponse,
                 responses={400: {"description": "Bad JSON, fields or input"}, 413: {"description": "Too large"},
                            503: {"description": "Queue full or shutting down; see Retry-After"}})
    async def translate(body: TranslateRequest, request: Request):
        if (body.text is None) == (body.ids is None):
            return error(400, "bad request: give either text or ids")
        try:
            translator = service.running()
            options = body.options(translator)
            if body.text is not None:
                sources, plan = service.encode(body.text, body.src_lang, body.tgt_lang, body.split)
            else:
                service.check_size(body.ids, "token ids")
                sources = body.ids
            if body.stream:
                if body.text is None:
                    return error(400, "bad request: stream takes text, not ids")
                service.check_sentences(len(sources))
                stream = translator.stream_ids_async(sources, options, body.tgt_lang, TextEvents(plan))
                return EventSourceResponse(events(stream, plan, service), ping=15, shutdown_grace_period=55)
            future = service.submit(sources, options, body.tgt_lang)
        except MissingLanguage as exc:  # named as the request's field, not the CLI's option
            return error(400, exc.worded(MissingLanguage.FIELDS[exc.side]))
        except TwostepError as exc:
            return V1_REFUSED.response(service, exc)
        try:
            results = await until_disconnected(asyncio.wrap_future(future), request)
        except TwostepError as exc:  # raised while decoding: an engine profile's limit, say
            return error(400, str(exc))
        if results is None:  # the client went away; its rows were dropped
            return Response(status_code=499)
        results = await translator.replace_unknowns_async(sources, results, options, body.tgt_lang)
        # TranslateResponse's shape, built as plain JSON: validating our own output per request buys nothing
        if body.text is None:
            return JSONResponse({"translations": [[{"tokens": h.tokens, "score": h.score} for h in hyps]
                                                  for hyps in results]})
        return JSONResponse({"translations": hypotheses(plan, results, translator.translator.text)})

    @routes.get("/languages")
    async def languages():
        try:
            tokenizer = service.running().tokenizer
        except NotReady as exc:
            return V1_REFUSED.response(service, exc)
        return language_list(tokenizer.spec.languages if tokenizer else None)

    return routes
