"""Text in, text out: tokenizer + decoding loop over any backend's step session."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twostep.errors import BadInput
from twostep.runtime.decoding import DecodeOptions, Hypothesis, Specials, StepSession, decode, decode_steps
from twostep.runtime.decoding.batch import pad_batch
from twostep.runtime.decoding.constraints import Constraints
from twostep.runtime.decoding.options import is_int, with_defaults
from twostep.runtime.documents import DocumentPlan, split_documents
from twostep.runtime.glossary import Found, Glossary, Terms, sentence_terms
from twostep.runtime.streaming import Event, Events, TextEvents
from twostep.runtime.tokenizer import Tokenizer

SURFACES = 4096  # sentences whose unknown pieces a Translator keeps for replace_unknowns, the latest


@dataclass(frozen=True)
class Termed:
    """A text translated with a glossary: its translation, and the glossary's terms found in it that the
    translation holds (`applied`) and does not (`unmet`), in the order they occur."""

    text: str
    applied: list[Found]
    unmet: list[Found]


@dataclass(frozen=True)
class Limits:
    """What a model takes and how far a decode on its backend can go: the special token ids, the source
    vocabulary (ids must be below it), max_positions, and the target positions an engine profile holds."""

    specials: Specials
    vocab_size: int  # source vocab: ids must be below it
    max_positions: int
    target_positions: int  # how far a decode can go: max_positions, or an engine profile's limit

    @classmethod
    def of(cls, config, target_positions: int | None = None) -> Limits:
        return cls(specials=Specials.of(config), vocab_size=config.src_vocab_size,
                   max_positions=config.max_positions,
                   target_positions=min(target_positions or config.max_positions, config.max_positions))


class Translator:
    """`defaults`: the model's decoding defaults (its manifest's `decoding` section), under every call's options
    (`options_with`); `options`: what a call without options decodes with (default: the defaults)."""

    def __init__(self, session: StepSession, limits: Limits, tokenizer: Tokenizer | None = None,
                 batch_size: int = 32, options: DecodeOptions | None = None,
                 defaults: Mapping[str, Any] | None = None):
        self.session, self.limits, self.tokenizer = session, limits, tokenizer
        self.defaults = dict(defaults or {})
        self.batch_size, self.options = batch_size, self.options_with() if options is None else options
        self.lock = threading.Lock()  # threads may share a Translator: their calls run one after another
        self.surfaces: dict[tuple[int, ...], list[str | None]] = {}  # source_ids: the pieces of ids with unk
        self.lock_surfaces = threading.Lock()

    def options_with(self, **given: Any) -> DecodeOptions:
        """The model's decoding defaults with the options a caller gave (None: not given): with_defaults."""
        return with_defaults(self.defaults, **given)

    def check_ids(self, sources: Sequence[Sequence[int]]) -> None:
        s = self.limits
        for i, ids in enumerate(sources):
            if isinstance(ids, (str, bytes)) or not all(is_int(t) for t in ids):
                raise BadInput(f"sentence {i + 1} is not a list of integer token ids")
            if len(ids) == 0:
                raise BadInput(f"sentence {i + 1} is empty")
            if len(ids) > s.max_positions:
                raise BadInput(
                    f"sentence {i + 1} has {len(ids)} tokens, the model takes at most {s.max_positions} "
                    "(max_positions); split it into shorter sentences"
                )
            bad = [t for t in ids if not 0 <= t < s.vocab_size]
            if bad:
                raise BadInput(f"sentence {i + 1} has token ids outside the vocabulary [0, {s.vocab_size}): {bad[:5]}")

    def max_new_tokens(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None) -> int:
        """How far to decode: the options' max_new_tokens, else 2 x the longest source + 16, capped by
        max_positions. Beyond an engine profile's target positions (trt, ort-trt) it is a BadInput, not a
        silently shorter translation."""
        s = self.limits
        wanted = (options.max_new_tokens if options is not None else None) or 2 * max(len(x) for x in sources) + 16
        wanted = min(wanted, s.max_positions)
        if wanted > s.target_positions:
            raise BadInput(f"decoding up to {wanted} target positions, but the engine profile holds "
                           f"{s.target_positions}; rebuild the engines with twostep build-engine --max-new-tokens "
                           f"{wanted}, or ask for fewer (max_new_tokens)")
        return wanted

    def prefix(self, tgt_lang: str | None = None) -> tuple[int, ...]:
        """The tokens forced after the decoder's start for a target language (M2M100's __fr__; none for a model
        whose language token goes into the source, like Marian's >>fra<<)."""
        if self.tokenizer is None:
            if tgt_lang is not None:
                raise BadInput("this model has no tokenizer, hence no languages: leave out the target language")
            return ()
        targets = self.tokenizer.spec.languages.target.values()
        if tgt_lang is None and not any(t.decoder for t in targets):
            return ()  # token ids: a language token in the source is already there
        return self.tokenizer.spec.decoder_prefix(tgt_lang)

    def limits_with(self, limit: int, constraints: Sequence[Constraints | None]) -> list[int]:
        """Each sentence's max_new_tokens: `limit`, grown by its constraints' length (Constraints.length) up to
        max_positions and an engine profile's target positions."""
        cap = min(self.limits.max_positions, self.limits.target_positions)
        return [max(limit, min(limit + c.length, cap)) if c is not None else limit for c in constraints]

    def decode_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                   prefixes: Sequence[Sequence[int]] | None = None, tgt_lang: str | None = None,
                   constraints: Sequence[Constraints | None] | None = None) -> list[list[Hypothesis]]:
        """Token ids in (each ending with eos), n-best hypotheses out (without bos/eos), in input order.
        `options`: this call's, instead of the Translator's. `prefixes`: each sentence's forced tokens after
        the decoder's start, else those of `tgt_lang` for all. `constraints`: each sentence's (None: none),
        decoded by constrained beam search (decoding.search.ConstrainedBeam), its limit grown by their length."""
        options = self.options if options is None else options
        if prefixes is None:
            prefixes = [self.prefix(tgt_lang)] * len(sources)
        if constraints is None:
            constraints = [None] * len(sources)
        elif options.sampling and any(c is not None for c in constraints):
            raise BadInput("a glossary needs beam search or greedy decoding, not sampling")
        self.check_ids(sources)
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths share a batch
        results: list[list[Hypothesis]] = [[] for _ in sources]
        with self.lock:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch = [sources[i] for i in chunk]
                limits = self.limits_with(self.max_new_tokens(batch, options), [constraints[i] for i in chunk])
                outs = decode(self.session, batch, options, specials=self.limits.specials,
                              max_new_tokens=max(limits), limits=limits, prefixes=[prefixes[i] for i in chunk],
                              constraints=[constraints[i] for i in chunk])
                for i, out in zip(chunk, outs):
                    results[i] = out
            return self.replace_unknowns(sources, results, options, prefixes)

    def translate_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                      tgt_lang: str | None = None) -> list[list[int]]:
        return [hyps[0].tokens if hyps else [] for hyps in self.decode_ids(sources, options, tgt_lang=tgt_lang)]

    def encode(self, texts: Sequence[str], src_lang: str | None = None, tgt_lang: str | None = None) -> list[list[int]]:
        """Source ids of each text, with the languages' tokens (twostep.artifact.tokenizer)."""
        if self.tokenizer is None:
            raise BadInput("this model has no tokenizer: text translation needs one (token-id APIs work without)")
        self.tokenizer.check_languages(src_lang, tgt_lang)
        out = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise BadInput(f"sentence {i + 1} is not text")
            if not text.strip():
                raise BadInput(f"sentence {i + 1} is empty")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates, which SentencePiece cannot take
                raise BadInput(f"sentence {i + 1} is not valid Unicode text (it holds lone surrogates)") from None
            out.append(self.source_ids(text, src_lang, tgt_lang))
        return out

    def source_ids(self, text: str, src_lang: str | None, tgt_lang: str | None) -> list[int]:
        """A sentence's source ids; where one is unk's, the pieces they are are kept for replace_unknowns (a piece
        the vocabulary lacks is copied as the text has it, which its id cannot give back)."""
        ids, pieces = self.tokenizer.source_tokens(text, src_lang, tgt_lang)
        if self.limits.specials.unk_id in ids:
            with self.lock_surfaces:
                self.surfaces[tuple(ids)] = pieces
                while len(self.surfaces) > SURFACES:
                    del self.surfaces[next(iter(self.surfaces))]
        return ids

    def replace_unknowns(self, sources: Sequence[Sequence[int]], hypotheses: list[list[Hypothesis]],
                         options: DecodeOptions, prefixes: Sequence[Sequence[int]]) -> list[list[Hypothesis]]:
        """With options.replace_unknowns, each hypothesis that holds <unk> gets its replacements, as CTranslate2
        makes them: the source piece of the position the decoder's alignment (session.alignment, one teacher-forced
        run of the hypothesis) weighs most at that token, among the sentence's own pieces (not its language tokens
        or suffix). `prefixes`: each sentence's forced tokens after the decoder's start."""
        unk = self.limits.specials.unk_id
        todo = [(i, j) for i, hyps in enumerate(hypotheses) for j, h in enumerate(hyps) if unk in h.tokens]
        if not options.replace_unknowns or not todo:
            return hypotheses
        out = [list(hyps) for hyps in hypotheses]
        start, pad = self.limits.specials.bos_id, self.limits.specials.pad_id
        for first in range(0, len(todo), self.batch_size):
            chunk = todo[first : first + self.batch_size]
            ids, mask = pad_batch([sources[i] for i, _ in chunk], pad)
            targets, _ = pad_batch([[start, *prefixes[i], *hypotheses[i][j].tokens[:-1]] for i, j in chunk], pad)
            alignment = self.session.alignment(ids, mask, targets)  # (N, T, S)
            for n, (i, j) in enumerate(chunk):
                lead, end = self.source_span(sources[i])
                with self.lock_surfaces:
                    surfaces = self.surfaces.get(tuple(sources[i]))
                h, replaced = hypotheses[i][j], []
                for k in np.flatnonzero(np.asarray(h.tokens) == unk):
                    pos = lead + int(alignment[n, len(prefixes[i]) + k, lead:end].argmax())
                    piece = surfaces[pos] if surfaces else self.source_piece(sources[i][pos])
                    if piece is not None:
                        replaced.append((int(k), piece))
                out[i][j] = dataclasses.replace(h, replacements=tuple(replaced))
        return out

    def source_span(self, ids: Sequence[int]) -> tuple[int, int]:
        """Where a sentence's own pieces are among its source ids: after its language tokens, before the suffix."""
        if self.tokenizer is None:
            return 0, len(ids)
        spec = self.tokenizer.spec
        languages = {i for ids_ in spec.languages.source.values() for i in ids_} | {
            i for t in spec.languages.target.values() for i in t.source}
        lead = next((n for n, i in enumerate(ids) if i not in languages), len(ids))
        suffix = list(spec.source_suffix)
        end = len(ids) - len(suffix) if suffix and list(ids[len(ids) - len(suffix):]) == suffix else len(ids)
        return lead, max(end, lead + 1)

    def source_piece(self, token: int) -> str | None:
        return self.tokenizer.source_piece(token) if self.tokenizer is not None else None

    def text(self, hypothesis: Hypothesis) -> str:
        return self.tokenizer.decode(hypothesis.tokens, dict(hypothesis.replacements))

    def best_texts(self, hypotheses: Sequence[Sequence[Hypothesis]]) -> list[str]:
        """Each sentence's best hypothesis as text ('' for none): decode_ids' answer as translate() gives it."""
        return [self.text(hyps[0]) if hyps else self.tokenizer.decode([]) for hyps in hypotheses]

    def nbest_texts(self, hypotheses: Sequence[Sequence[Hypothesis]]) -> list[list[tuple[str, float]]]:
        """Each sentence's hypotheses as (text, score): decode_ids' answer as translate_nbest() gives it."""
        return [[(self.text(h), h.score) for h in hyps] for hyps in hypotheses]

    def split_documents(self, texts: Sequence[str], src_lang: str | None = None,
                        tgt_lang: str | None = None) -> tuple[list[str], DocumentPlan]:
        """Each text as a document (twostep.runtime.documents): all texts' sentences, each within max_positions
        once encoded with its language tokens (a longer one cut further), and the plan that joins their
        translations back into the texts, with the whitespace and line breaks between sentences kept."""
        sentences, plan, _ = self.documents(texts, src_lang, tgt_lang)
        return sentences, plan

    def encode_documents(self, texts: Sequence[str], src_lang: str | None = None,
                         tgt_lang: str | None = None) -> tuple[list[list[int]], DocumentPlan]:
        """split_documents' sentences as source ids (encode's), and its plan: each sentence is tokenized once,
        by the split that measures it."""
        sentences, plan, encoded = self.documents(texts, src_lang, tgt_lang)
        return [encoded[s] for s in sentences], plan

    def documents(self, texts: Sequence[str], src_lang: str | None,
                  tgt_lang: str | None) -> tuple[list[str], DocumentPlan, dict[str, list[int]]]:
        if self.tokenizer is None:
            raise BadInput("this model has no tokenizer: text translation needs one (token-id APIs work without)")
        self.tokenizer.check_languages(src_lang, tgt_lang)
        encoded: dict[str, list[int]] = {}  # every piece the split measured, with its ids

        def count(piece: str) -> int:
            if piece not in encoded:
                encoded[piece] = self.source_ids(piece, src_lang, tgt_lang)
            return len(encoded[piece])

        lang = self.tokenizer.spec.languages.pick("source", src_lang)
        return *split_documents(texts, lang, count, self.limits.max_positions), encoded

    def translate(self, texts: Sequence[str], options: DecodeOptions | None = None, src_lang: str | None = None,
                  tgt_lang: str | None = None, split: bool = False) -> list[str]:
        """Each text's translation. `split`: each text is a document, translated sentence by sentence
        (split_documents); else each text is one sentence."""
        if split:
            ids, plan = self.encode_documents(texts, src_lang, tgt_lang)
            return plan.join(self.best_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang)))
        ids = self.encode(texts, src_lang, tgt_lang)
        return self.best_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang))

    def sentence_terms(self, texts: Sequence[str], glossary: Glossary) -> list[Terms | None]:
        """Each sentence's glossary terms, their target variants in this model's target tokenizer."""
        if self.tokenizer is None:
            raise BadInput("this model has no tokenizer: a glossary needs one")
        variants: dict[str, list] = {}

        def of(target: str) -> list:
            if target not in variants:
                variants[target] = self.tokenizer.target_variants(target)
            return variants[target]

        return [sentence_terms(glossary, text, of) for text in texts]

    def translate_glossary(self, texts: Sequence[str], glossary: Glossary, options: DecodeOptions | None = None,
                           src_lang: str | None = None, tgt_lang: str | None = None,
                           split: bool = False) -> list[Termed]:
        """translate(), each sentence in which `glossary` finds terms constrained to hold one target variant of
        each (the others decode as translate() decodes them); with the terms each text's translation applied and
        those it did not (a sentence that reached its limit first)."""
        if (self.options if options is None else options).sampling:
            raise BadInput("a glossary needs beam search or greedy decoding, not sampling")
        if split:
            sentences, plan = self.split_documents(texts, src_lang, tgt_lang)
        else:
            sentences, plan = list(texts), None
        ids = self.encode(sentences, src_lang, tgt_lang)
        terms = self.sentence_terms(sentences, glossary)
        hyps = self.decode_ids(ids, options, tgt_lang=tgt_lang,
                               constraints=[t.constraints if t is not None else None for t in terms])
        outcomes = [t.outcome(h[0].unmet if h else ()) if t is not None else ([], []) for t, h in zip(terms, hyps)]
        sentence_texts = self.best_texts(hyps)
        if plan is None:
            return [Termed(text, applied, unmet) for text, (applied, unmet) in zip(sentence_texts, outcomes)]
        return [Termed(text, [f for a, _ in mine for f in a], [f for _, u in mine for f in u])
                for text, mine in zip(plan.join(sentence_texts), plan.parts(outcomes))]

    def translate_nbest(self, texts: Sequence[str], options: DecodeOptions | None = None,
                        src_lang: str | None = None, tgt_lang: str | None = None,
                        split: bool = False) -> list[list[tuple[str, float]]]:
        """Each text's hypotheses as (text, score). `split`: as translate's; a text of several sentences then has
        one hypothesis, its sentences' best joined (DocumentPlan.join_nbest)."""
        if split:
            ids, plan = self.encode_documents(texts, src_lang, tgt_lang)
            return plan.join_nbest(self.nbest_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang)))
        ids = self.encode(texts, src_lang, tgt_lang)
        return self.nbest_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang))

    def stream(self, texts: Sequence[str], options: DecodeOptions | None = None, src_lang: str | None = None,
               tgt_lang: str | None = None, split: bool = False) -> Iterator[Event]:
        """translate() as it decodes: Delta and SentenceDone events (twostep.runtime.streaming), `sentence`
        indexing `texts`; each sentence's deltas concatenated are its translate() text. Greedy search and
        sampling give deltas, beam search a SentenceDone per sentence as it finishes. `split`: each text is a
        document (split_documents): `sentence` indexes their sentences, and a TextDone comes once a text's
        sentences are all done. The Translator is held (other calls wait) until the iterator ends or is closed."""
        if split:
            sentences, plan = self.split_documents(texts, src_lang, tgt_lang)
            texts_done = TextEvents(plan)
            for event in self.stream(sentences, options, src_lang, tgt_lang):
                yield event
                yield from texts_done.after(event)
            return
        options = self.options if options is None else options
        ids = self.encode(texts, src_lang, tgt_lang)
        prefix = self.prefix(tgt_lang)
        self.check_ids(ids)
        events = Events(self.tokenizer, deltas=options.beam_size == 1)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch
        with self.lock:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch = [ids[i] for i in chunk]
                for finished, progress in decode_steps(
                        self.session, batch, options, specials=self.limits.specials,
                        max_new_tokens=self.max_new_tokens(batch, options), prefixes=[prefix] * len(batch),
                        stream=events.deltas):
                    for j, tokens in progress:
                        yield from events.tokens(chunk[j], tokens)
                    for j, hyps in finished:
                        yield from events.done(chunk[j], hyps)


def open_translator(model_dir: Path, backend: str | None = None, checkpoint: Path | None = None,
                    options: DecodeOptions | Mapping[str, Any] | None = None, batch_size: int = 32,
                    **backend_options):
    """A Translator over an artifact directory (any backend; ort-cpu by default) or over a checkpoint
    directory (the torch backend). `options`: what it decodes with by default: DecodeOptions as they are, or
    the options given (a mapping, None values not given) over the model's decoding defaults (the manifest's
    `decoding` section, a checkpoint info's), or (None) those defaults. Returns (translator, backend) so the
    caller can close the backend."""
    from twostep.artifact import MANIFEST
    from twostep.runtime import backends

    model_dir = Path(model_dir)
    if (model_dir / MANIFEST).is_file():
        from twostep.artifact import load_artifact

        artifact = load_artifact(model_dir)
        defaults = artifact.manifest.decoding
        where = f"{model_dir / MANIFEST}: decoding"
        if not isinstance(options, DecodeOptions):
            options = with_defaults(defaults, where, **(options or {}))
        name = backend or "ort-cpu"
        sized = backends.workload_options(name, artifact.config, rows=batch_size * options.beam_size)
        be = backends.create(name, artifact=artifact, checkpoint_dir=checkpoint, **sized, **backend_options)
        tokenizer = Tokenizer.load(model_dir, artifact.tokenizer) if artifact.tokenizer else None
    else:
        if backend not in (None, "torch"):
            raise BadInput(f"{model_dir} is not an artifact directory (no {MANIFEST}); backend {backend!r} runs "
                           "exported graphs: run `twostep export` first, or use --backend torch on a checkpoint")
        from twostep.model.checkpoint import read_decoding, read_tokenizer

        defaults, where = read_decoding(model_dir), f"{model_dir}: decoding"
        if not isinstance(options, DecodeOptions):
            options = with_defaults(defaults, where, **(options or {}))
        be = backends.create("torch", checkpoint_dir=model_dir, **backend_options)
        spec = read_tokenizer(model_dir)
        tokenizer = Tokenizer.load(model_dir, spec) if spec else None
    limits = Limits.of(be.config, be.target_positions)
    return Translator(be.session(), limits, tokenizer, batch_size, options, defaults), be
