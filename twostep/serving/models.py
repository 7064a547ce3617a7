"""The models one server holds, which of them answers a language pair, and which are loaded.

`Catalog.open(paths)` reads each model's languages from its manifest, opening no session: each path an artifact
folder, or a folder whose subfolders are artifacts (in name order). A request names a source and a target
language (a model's own code, or a standard tag: twostep.artifact.tokenizer.standard_matches); `Catalog.route`
gives what answers it:

- the model that has both, or, where several have them, the one with the fewest pairs (the most specialized: a
  bilingual en -> fr package before NLLB's 40,000 pairs). Two models of equally many pairs that share one are
  refused when the server starts, naming both: there is no rule to choose between them;
- else two models through the pivot language (English unless the server says otherwise), as argostranslate
  composes them: the first model's best translation is the second's source;
- the text itself where source and target are one language (argostranslate's identity translation), a language
  the server only translates into included: as in argostranslate, it is a source of itself alone.

`Catalog.languages` lists them so, each with every target it reaches: argostranslate's installed languages, as
LibreTranslate lists them, except that argostranslate composes through any language and `route` through the pivot
alone.

A server of one model keeps that model's own rules: a side it names no languages for (a bilingual Marian, a
checkpoint) takes any code. In a server of several every model must name its pair (`twostep import --src-lang
--tgt-lang`).

`Pool` keeps the loaded models: all of them, or at most `max_loaded` (the least recently used one is unloaded once
its requests are done; the others load on first use), each its own BatchingTranslator on its own session. Or, given
a `loader`, the models that loader keeps: under Ray Serve, its model multiplexing chooses which models a replica
holds (twostep.serving.ray_app), and the pool lends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from twostep.artifact import MANIFEST, load_artifact
from twostep.artifact.tokenizer import Languages, model_tag, standard_matches
from twostep.errors import BadInput, TwostepError

log = logging.getLogger("twostep.serving")


class Unsupported(BadInput):
    """A language no model of the server has (`side`, the code as `given`, the codes `known` on that side), in
    LibreTranslate's words ("zz is not supported"; `plain` in twostep's, which lists the codes), or a pair that no
    model and no pivot reaches (side None)."""

    def __init__(self, message: str, side: str | None = None, given: str | None = None,
                 known: Sequence[str] = (), who: str = "this model has"):
        super().__init__(message)
        self.side = side
        self.plain = message if side is None else (
            f"unknown {side} language {given!r}: {who} {', '.join(known) or f'no {side} languages'}")


def tag_of(code: str) -> str:
    """A model's language code as its standard tag (fra_Latn -> fr), or the code itself where it has none."""
    try:
        return model_tag(code)
    except ValueError:
        return code


def described(code: str) -> dict:
    """A language code with its standard BCP-47 tag and English name (None where it has none)."""
    import langcodes

    try:
        tag = model_tag(code)
        name = langcodes.Language.get(tag).display_name()
    except (ValueError, LookupError, ImportError):  # not a tag; or the names' package (language-data) is missing
        return {"code": code, "tag": None, "name": None}
    return {"code": code, "tag": tag, "name": name}


def model_paths(paths: Iterable[Path]) -> list[Path]:
    """Each path an artifact (or checkpoint) folder as given, or a folder of them: its subfolders that are
    artifacts, in name order. A folder that is neither is refused, naming it."""
    out = []
    for path in map(Path, paths):
        if not path.is_dir() or (path / MANIFEST).is_file() or (path / "config.json").is_file():
            out.append(path)
            continue
        inside = sorted(p for p in path.iterdir() if (p / MANIFEST).is_file())
        if not inside:
            raise TwostepError(f"{path}: not an artifact directory, nor a folder of them (no {MANIFEST} in it or in "
                               "its subfolders)")
        out += inside
    return out


@dataclass(frozen=True, eq=False)
class Model:
    """One model of the server: where it is, and its languages (None: a checkpoint's, read once it is loaded)."""

    name: str
    path: Path
    languages: Languages | None

    @property
    def sources(self) -> list[str]:
        return sorted(self.languages.source) if self.languages else []

    @property
    def targets(self) -> list[str]:
        return sorted(self.languages.target) if self.languages else []

    @functools.cached_property
    def names(self) -> dict[str, str]:
        """Each of its codes' public name: its standard tag, or the code itself where it has none or where two of
        its codes share one (a tag that names two codes is no name for either)."""
        codes = sorted({*self.sources, *self.targets})
        tags = {code: tag_of(code) for code in codes}
        shared = [tag for tag in tags.values() if list(tags.values()).count(tag) > 1]
        return {code: code if tag in shared else tag for code, tag in tags.items()}

    def pairs(self) -> frozenset[tuple[str, str]]:
        """The (source, target) public names it translates between (NLLB: 40,000)."""
        return self._pairs

    @functools.cached_property
    def _pairs(self) -> frozenset[tuple[str, str]]:
        return frozenset((self.names[s], self.names[t]) for s in self.sources for t in self.targets
                         if self.names[s] != self.names[t])

    def code(self, side: str, wanted: str) -> str | None:
        """The model's code on `side` that `wanted` (its own code, or a standard one) means; None where it has no
        such language. A standard code that two of its codes match equally is a BadInput naming them."""
        known = self.sources if side == "source" else self.targets
        if wanted in known:
            return wanted
        matches = standard_matches(wanted, known)
        if len(matches) > 1:
            raise BadInput(f"ambiguous {side} language {wanted!r}: it may be {' or '.join(matches)} ({self.name}); "
                           "name one of them")
        return matches[0] if matches else None


@dataclass(frozen=True)
class Leg:
    """One model's translation: its codes for the source and target (None: a side it names no languages for)."""

    model: Model
    source: str | None
    target: str | None


@dataclass(frozen=True)
class Route:
    """What answers a pair: one leg, two through the pivot, or none (source and target are one language)."""

    legs: tuple[Leg, ...]
    source: str | None  # standard tags; None where a one-model server's model names no language on that side
    target: str | None

    @property
    def pivoted(self) -> bool:
        return len(self.legs) == 2


@dataclass(frozen=True)
class Catalog:
    """The server's models, most specialized first, and the pivot language (None: no pivoting)."""

    models: tuple[Model, ...]
    pivot: str | None = "en"

    @classmethod
    def open(cls, paths: Sequence[Path], pivot: str | None = "en") -> Catalog:
        """The models at `paths` (model_paths), their languages read from their manifests. Refused, one line: a
        model that names no languages beside others, and two models of equally many pairs that share one."""
        models = []
        for path in model_paths(paths):
            languages = None
            if (path / MANIFEST).is_file():
                tokenizer = load_artifact(path, check_hashes=False).tokenizer
                languages = tokenizer.languages if tokenizer else None
            models.append(Model(path.name, path.resolve(), languages))
        return cls.of(models, pivot)

    @classmethod
    def of(cls, models: Sequence[Model], pivot: str | None = "en") -> Catalog:
        """The models, most specialized first; refused as `open` says, and two models of one name."""
        named: dict[str, Model] = {}
        for m in models:
            other = named.setdefault(m.name, m)
            if other is not m:
                raise TwostepError(f"{other.path} and {m.path} are both named {m.name!r} (a model is named by its "
                                   "folder; /v1/languages and Ray Serve's serve_multiplexed_model_id name it so): "
                                   "rename one of the folders")
        if len(models) > 1:
            for m in models:
                if not m.sources or not m.targets:
                    side = "source" if not m.sources else "target"
                    raise TwostepError(f"{m.path}: names no {side} language; a server of several models routes each "
                                       "request by its language pair: import the model naming its pair (twostep "
                                       "import --src-lang --tgt-lang), then export it again")
        ordered = sorted(models, key=lambda m: len(m.pairs()))  # stable: equals keep their order
        seen: dict[tuple[str, str], Model] = {}
        for m in ordered:
            for pair in sorted(m.pairs()):
                other = seen.get(pair)
                if other is not None and len(other.pairs()) == len(m.pairs()):
                    raise TwostepError(f"{other.path} and {m.path} both translate {pair[0]} -> {pair[1]}, with as "
                                       "many pairs each: no rule chooses between them; serve one of them")
                seen.setdefault(pair, m)
        return cls(tuple(ordered), pivot)

    def model(self, name: str) -> Model:
        """The model of that name (its folder's)."""
        for m in self.models:
            if m.name == name:
                return m
        raise BadInput(f"no model named {name!r}; the server's models: {', '.join(m.name for m in self.models)}")

    @property
    def single(self) -> Model | None:
        return self.models[0] if len(self.models) == 1 else None

    def first(self, source: str, target: str) -> Leg | None:
        """The most specialized model that has both languages, as its leg."""
        for m in self.models:
            s, t = m.code("source", source), m.code("target", target)
            if s is not None and t is not None and m.names[s] != m.names[t]:
                return Leg(m, s, t)
        return None

    def tag(self, side: str, code: str) -> str | None:
        """The public name a request's code means on `side`, by the first model that has it; None: no model."""
        for m in self.models:
            own = m.code(side, code)
            if own is not None:
                return m.names[own]
        return None

    def route(self, source: str | None, target: str | None, lenient: bool = False) -> Route:
        """What answers a request from `source` to `target` (codes as the request gives them). Unsupported (a
        BadInput) for a language no model has on either side, in LibreTranslate's words ("zz is not supported"),
        and for a pair that no model and no pivot reaches; a missing code where the model needs one is the translator's
        MissingLanguage. A one-model server whose model names no languages on a side hands the code to the
        translator (which refuses it), or with `lenient` drops it: the model translates its one pair whatever
        the code says (LibreTranslate's clients always send both)."""
        single = self.single
        if single is not None and (not single.sources or not single.targets or source is None or target is None):
            # one model's own rules: a side without languages is the translator's, a missing code its default
            s = single.code("source", source) if single.sources and source is not None else source
            t = single.code("target", target) if single.targets and target is not None else target
            for side, given, own in (("source", source, s), ("target", target, t)):
                if given is not None and own is None:
                    known = single.sources if side == "source" else single.targets
                    raise Unsupported(f"{given} is not supported", side, given, known)
            if lenient:
                s, t = s if single.sources else None, t if single.targets else None
            return Route((Leg(single, s, t),), single.names.get(s), single.names.get(t))
        if source is None or target is None:
            raise BadInput("this server holds several models: name both the source and the target language")
        # a language of the server on either side: one only translated into is a source of itself (the text as
        # it came), as in argostranslate, and from it to another is "not available", not an unknown code
        source_tag = self.tag("source", source) or self.tag("target", source)
        target_tag = self.tag("target", target) or self.tag("source", target)
        for side, given, tag in (("source", source, source_tag), ("target", target, target_tag)):
            if tag is None:
                known = sorted({m.names[c] for m in self.models for c in (m.sources if side == "source"
                                                                             else m.targets)})
                raise Unsupported(f"{given} is not supported", side, given, known, "the server's models have")
        if source_tag == target_tag:
            return Route((), source_tag, target_tag)
        leg = self.first(source, target)
        if leg is not None:
            return Route((leg,), source_tag, target_tag)
        if self.pivot is not None and self.pivot not in (source_tag, target_tag):
            into, out = self.first(source, self.pivot), self.first(self.pivot, target)
            if into is not None and out is not None:
                return Route((into, out), source_tag, target_tag)
        raise Unsupported(f"{named(target_tag)} ({target_tag}) is not available as a target language from "
                          f"{named(source_tag)} ({source_tag})")

    def reachable(self) -> dict[str, tuple[list[str], list[str]]]:
        """Each source tag a request may name: (the targets its models translate to, those only the pivot
        reaches), tags sorted."""
        return self._reachable

    @functools.cached_property
    def _reachable(self) -> dict[str, tuple[list[str], list[str]]]:
        direct: dict[str, set[str]] = {}
        for m in self.models:
            for s, t in m.pairs():
                direct.setdefault(s, set()).add(t)
        out = {}
        for s, targets in sorted(direct.items()):
            pivoted = set()
            if self.pivot is not None and self.pivot in targets:
                pivoted = direct.get(self.pivot, set()) - targets - {s}
            out[s] = (sorted(targets), sorted(pivoted))
        return out

    def languages(self) -> dict[str, list[str]]:
        """Every language a model translates from or into (tags sorted), with each target a request from it
        reaches (`route`): itself, its models' targets, those through the pivot. argostranslate's installed
        languages, each with its identity and composite translations. Empty where a lone model names no language
        on a side (it takes any code there)."""
        return self._languages

    @functools.cached_property
    def _languages(self) -> dict[str, list[str]]:
        reachable = self.reachable()
        tags = sorted({tag for m in self.models for pair in m.pairs() for tag in pair})
        return {tag: sorted({tag, *(t for targets in reachable.get(tag, ()) for t in targets)}) for tag in tags}

    def source_tags(self) -> list[str]:
        return list(self._source_tags)

    @functools.cached_property
    def _source_tags(self) -> tuple[str, ...]:
        return tuple(sorted({m.names[c] for m in self.models for c in m.sources}))


def named(tag: str) -> str:
    return described(tag)["name"] or tag


Opener = Callable[[Model], tuple[object, object]]  # a model -> (its started BatchingTranslator, its backend)


@dataclass(eq=False)
class Loaded:
    model: Model
    translator: object  # BatchingTranslator
    backend: object
    users: int = 0
    unloaded: bool = False


Loader = Callable[[Model], Awaitable[Loaded]]  # a model -> its entry, opened (Pool.open) unless it is loaded


@dataclass(eq=False)
class Pool:
    """The loaded models (least recently used first): `use(model)` loads one on first use (in a thread: the event
    loop goes on) and lends its BatchingTranslator for a request. Beyond `max_loaded` (None: no bound) the least
    recently used one leaves; it closes once the requests using it are done (BatchingTranslator.close finishes
    its queued and running sentences).

    With a `loader`, the loader keeps the models instead (Ray Serve's model multiplexing: twostep.serving.ray_app):
    it opens them with `open` and unloads them with `unload`, by its own bound (max_loaded is then the loader's);
    an unloaded model still closes only once the requests using it are done."""

    opener: Opener
    max_loaded: int | None = None
    loader: Loader | None = None
    loaded: OrderedDict[str, Loaded] = field(default_factory=OrderedDict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    closing: set[asyncio.Future] = field(default_factory=set)

    async def load(self, model: Model) -> Loaded:
        """The model's entry, loaded now unless it is."""
        if self.loader is not None:
            entry = await self.loader(model)
            while entry.unloaded:  # unloaded for another model's load since the loader gave it: load it again
                entry = await self.loader(model)
            return entry
        key = str(model.path)
        async with self.locks.setdefault(key, asyncio.Lock()):
            entry = self.loaded.get(key)
            if entry is None:
                self.evict(room=1)  # first: a model's memory is given back before the next takes its own
                entry = await self.open(model)
            self.loaded.move_to_end(key)
            return entry

    async def open(self, model: Model) -> Loaded:
        """The model opened now, in a thread (it takes seconds), as a loaded entry of this pool."""
        translator, backend = await asyncio.to_thread(self.opener, model)
        entry = self.loaded[str(model.path)] = Loaded(model, translator, backend)
        log.info("loaded %s on %s (%d loaded)", model.path, getattr(backend, "name", backend), len(self.loaded))
        return entry

    def evict(self, room: int) -> None:
        """Unload the least recently used models, idle ones first, until `room` more fit within max_loaded."""
        while self.max_loaded is not None and self.loaded and len(self.loaded) + room > self.max_loaded:
            others = list(self.loaded)
            idle = [k for k in others if self.loaded[k].users == 0]
            entry = self.loaded[(idle or others)[0]]
            log.info("unloading %s (--max-loaded %d)", entry.model.path, self.max_loaded)
            self.drop(entry)
            if entry.users == 0:
                self.close_later(entry)

    async def unload(self, entry: Loaded) -> None:
        """Unload an entry (the loader's call): closed now if no request uses it, else by the last one's `release`.
        Nothing for an entry that is no longer loaded (closed with the pool)."""
        if self.loaded.get(str(entry.model.path)) is not entry:
            return
        log.info("unloading %s", entry.model.path)
        self.drop(entry)
        if entry.users == 0:
            await asyncio.to_thread(close, entry)

    def drop(self, entry: Loaded) -> None:
        del self.loaded[str(entry.model.path)]
        entry.unloaded = True

    def close_later(self, entry: Loaded) -> None:
        task = asyncio.ensure_future(asyncio.to_thread(close, entry))
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    async def acquire(self, model: Model) -> Loaded:
        """The model's entry, loaded, lent until `release`: it is not closed meanwhile."""
        entry = await self.load(model)
        entry.users += 1
        return entry

    def release(self, entry: Loaded) -> None:
        entry.users -= 1
        if entry.unloaded and entry.users == 0:
            self.close_later(entry)

    @contextlib.asynccontextmanager
    async def use(self, model: Model) -> AsyncIterator[object]:
        """The model's BatchingTranslator, loaded, for the length of the block."""
        entry = await self.acquire(model)
        try:
            yield entry.translator
        finally:
            self.release(entry)

    def queue_depth(self) -> int:
        return sum(e.translator.queue_depth for e in list(self.loaded.values()))

    async def close(self) -> None:
        """Close every loaded model (their queued and running sentences finish first)."""
        entries = list(self.loaded.values())
        self.loaded.clear()
        await asyncio.gather(*(asyncio.to_thread(close, e) for e in entries), *self.closing)


def close(entry: Loaded) -> None:
    entry.translator.close()
    entry.backend.close()
    log.info("unloaded %s", entry.model.path)
