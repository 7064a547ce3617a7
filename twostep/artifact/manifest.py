"""manifest.json as a frozen value: what export writes and load_artifact returns. Nothing outside this package
reads the manifest's raw keys.

    format, schema_version   "twostep-artifact", 3
    model                    the model config (twostep.artifact.config)
    special_tokens           pad, unk, bos, eos (the config's ids)
    source_suffix            "eos": source token ids end with eos; decoding starts from bos
    max_positions, dtype, precision, quantization, fusions, opset
    graphs                   the contract's two graphs: {name: {file, inputs, outputs}}
    variants                 runtime-specific graphs beside them: {name: {file, inputs, outputs, runtime, ops}}
    tokenizer                how text becomes ids and back, or null (twostep.artifact.tokenizer)
    decoding                 optional: how the model decodes when a caller does not say (DecodeOptions field
                             names -> values, e.g. an Argos Translate package's beam 4 and CTranslate2's rule,
                             a transformers model's generation config and generate()'s rule);
                             absent: twostep's defaults. Older twostep readers ignore it.
    task, exporter, validation
    files                    sha256 of every file of the artifact

`parse` checks every part a consumer relies on (any problem is a BadArtifact); the graphs' I/O must be exactly
what the model config implies (twostep.artifact.spec). Variants this twostep does not know (from a newer one)
are left out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twostep.artifact.config import ModelConfig
from twostep.artifact.spec import CONTRACT, GRAPHS, GraphSpec
from twostep.artifact.tokenizer import TokenizerSpec
from twostep.artifact.trust import safe_name
from twostep.errors import BadArtifact, BadCheckpoint

FORMAT = "twostep-artifact"
# 3: `tokenizer` is a section (files, vocabulary tables, languages) instead of one SentencePiece file name; the
# model config says how the decoder starts and what it never generates. 2: the decoder takes past_lengths [batch],
# so that rows of one batch can be at different positions (a sentence joins a running batch). 1: every row at the
# cache's one position. This twostep reads 2 as well: its tokenizer file is a plain SentencePiece spec.
SCHEMA_VERSION = 3
READS = (2, 3)
DTYPES = ("float32", "float16")
PRECISIONS = ("fp32", "fp16", "int8", "int4")
SHA256 = re.compile(r"[0-9a-f]{64}")
# The decoding defaults an artifact may record: DecodeOptions (twostep.runtime.decoding) field -> JSON type. The
# values' ranges are DecodeOptions' to check, when a translator opens the artifact.
DECODING_FIELDS = {"beam_size": int, "n_best": int, "length_penalty": float, "beam_stop": str, "max_new_tokens": int,
                   "min_new_tokens": int, "sampling": bool, "temperature": float, "top_k": int, "top_p": float,
                   "replace_unknowns": bool, "no_repeat_ngram_size": int}


@dataclass(frozen=True)
class GraphEntry:
    """A graph of the artifact: its file and I/O, and for a variant the runtime and ops it needs."""

    name: str
    file: str
    spec: GraphSpec
    runtime: str | None = None
    ops: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {"file": self.file, **self.spec.to_dict()}
        if self.runtime is not None:
            out.update(runtime=self.runtime, ops=list(self.ops))
        return out


@dataclass(frozen=True)
class Manifest:
    config: ModelConfig
    dtype: str  # the graphs' float I/O dtype
    precision: str  # the weights': fp32, fp16, int8 or int4
    opset: int
    graphs: Mapping[str, GraphEntry]  # the contract's two, then the variants this twostep knows
    tokenizer: TokenizerSpec | None = None
    task: str | None = None
    quantization: dict | None = None
    fusions: dict | None = None  # com.microsoft ops: ONNX Runtime only
    exporter: dict = field(default_factory=dict)
    validation: dict | None = None
    files: Mapping[str, str] = field(default_factory=dict)  # every file's sha256
    decoding: Mapping[str, Any] | None = None  # decoding defaults (DECODING_FIELDS); None: twostep's

    @property
    def variants(self) -> dict[str, GraphEntry]:
        return {name: entry for name, entry in self.graphs.items() if name not in CONTRACT}

    def graph_files(self) -> list[str]:
        return [entry.file for entry in self.graphs.values()]

    def opened_files(self) -> list[str]:
        """The files the runtime opens itself: the graphs and the tokenizer."""
        return self.graph_files() + (self.tokenizer.files() if self.tokenizer else [])

    def replace(self, **changes: Any) -> Manifest:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        c = self.config
        out = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "model": c.to_dict(),
            "special_tokens": {"pad": c.pad_id, "unk": c.unk_id, "bos": c.bos_id, "eos": c.eos_id},
            "source_suffix": "eos",
            "max_positions": c.max_positions,
            "dtype": self.dtype,
            "precision": self.precision,
            "quantization": self.quantization,
            "fusions": self.fusions,
            "opset": self.opset,
            "graphs": {name: self.graphs[name].to_json() for name in CONTRACT},
            "variants": {name: entry.to_json() for name, entry in self.variants.items()},
            "tokenizer": self.tokenizer.to_json() if self.tokenizer else None,
            "task": self.task,
            "exporter": self.exporter,
        }
        if self.decoding is not None:
            out["decoding"] = dict(self.decoding)
        if self.validation is not None:
            out["validation"] = self.validation
        out["files"] = dict(self.files)
        return out

    @classmethod
    def parse(cls, data: Any, where: str) -> Manifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BadArtifact(f"{where}: not a twostep manifest (format != {FORMAT!r})")
        version = data.get("schema_version")
        if version not in READS or isinstance(version, bool):
            raise BadArtifact(schema_message(where, version))
        try:
            config = ModelConfig.from_dict(value(data, "model", dict, where))
        except BadCheckpoint as exc:
            raise BadArtifact(f"{where}: malformed manifest ({exc})") from None
        dtype = value(data, "dtype", str, where, DTYPES)
        precision = value(data, "precision", str, where, PRECISIONS) if "precision" in data else "fp32"
        if value(data, "max_positions", int, where) != config.max_positions:
            raise BadArtifact(f"{where}: malformed manifest (max_positions differs from model.max_positions)")
        opset = value(data, "opset", int, where)
        tokenizer = parse_tokenizer(data.get("tokenizer"), version, config, where)
        files = value(data, "files", dict, where)
        for name, digest in files.items():
            safe_name(name, where)
            if not isinstance(digest, str) or not SHA256.fullmatch(digest):
                raise BadArtifact(f"{where}: malformed manifest (sha256 of {name!r} is {digest!r:.80})")
        graphs = value(data, "graphs", dict, where)
        variants = data.get("variants", {})  # artifacts of an older twostep have none
        if not isinstance(variants, dict):
            raise BadArtifact(f"{where}: malformed manifest ('variants' is {type(variants).__name__})")
        entries = {}
        for name, info in GRAPHS.items():
            section, key = (graphs, "graphs") if name in CONTRACT else (variants, "variants")
            if name not in CONTRACT and name not in variants:
                continue
            entry = value(section, name, dict, f"{where}: {key}")
            file = safe_name(value(entry, "file", str, f"{where}: {key}.{name}"), where)
            spec, declared = info.spec(config, dtype), {k: entry.get(k) for k in ("inputs", "outputs")}
            if spec.searches and declared == spec.without_search().to_dict():  # exported before the search outputs
                spec = spec.without_search()
            if declared != spec.to_dict():
                raise BadArtifact(f"{where}: {key}.{name} inputs/outputs are not those the model config implies; "
                                  "the manifest was edited or is damaged: re-export the artifact")
            entries[name] = GraphEntry(name, file, spec, info.runtime, info.ops)  # runtime and ops: as declared
        task = data.get("task")
        return cls(config=config, dtype=dtype, precision=precision, opset=opset, graphs=entries,
                   tokenizer=tokenizer, task=task if isinstance(task, str) else None,
                   quantization=data.get("quantization"), fusions=data.get("fusions"),
                   exporter=data.get("exporter") or {}, validation=data.get("validation"), files=files,
                   decoding=parse_decoding(data.get("decoding"), f"{where}: malformed manifest"))


def parse_decoding(data: Any, where: str, error: type[Exception] = BadArtifact) -> dict[str, Any] | None:
    """A decoding section (a manifest's, or a checkpoint info's): None, or a dict of DECODING_FIELDS with values of
    their types; anything else is an `error` that names every problem on one line."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise error(f"{where} ('decoding' is {type(data).__name__}, expected an object of decoding options)")
    problems = []
    for key, found in data.items():
        kind = DECODING_FIELDS.get(key)
        types = (int, float) if kind is float else kind  # JSON writes 1.0 as 1
        if kind is None:
            problems.append(f"unknown option {key!r:.40}")
        elif found is None and key == "max_new_tokens":  # null: 2 x source length + 16
            continue
        elif isinstance(found, bool) != (kind is bool) or not isinstance(found, types):
            problems.append(f"{key} is {type(found).__name__} {found!r:.40}, expected {kind.__name__}")
    if problems:
        raise error(f"{where} (decoding: {'; '.join(problems)}; known options: {', '.join(DECODING_FIELDS)})")
    return dict(data)


def parse_tokenizer(data: Any, version: int, config: ModelConfig, where: str) -> TokenizerSpec | None:
    if data is None:
        return None
    if version == 2:  # one SentencePiece file whose ids are the model's
        if not isinstance(data, str):
            raise BadArtifact(f"{where}: malformed manifest ('tokenizer' is {type(data).__name__})")
        c = config
        return TokenizerSpec.sentencepiece(safe_name(data, where), c.pad_id, c.unk_id, c.bos_id, c.eos_id)
    return TokenizerSpec.parse(data, where, (config.src_vocab_size, config.tgt_vocab_size))


def value(data: dict, key: str, types: type | tuple[type, ...], where: str, choices: tuple = ()) -> Any:
    if key not in data:
        raise BadArtifact(f"{where}: malformed manifest (missing {key!r})")
    found = data[key]
    if not isinstance(found, types) or isinstance(found, bool):
        raise BadArtifact(f"{where}: malformed manifest ({key!r} is {type(found).__name__} {found!r:.60})")
    if choices and found not in choices:
        raise BadArtifact(f"{where}: malformed manifest ({key!r} is {found!r:.60}, expected one of {choices})")
    return found


def schema_message(where: str, version: Any) -> str:
    """Why an artifact of another schema version cannot be read, and what to do. cpp/src/manifest.cpp says the
    same."""
    if isinstance(version, int) and not isinstance(version, bool) and 1 <= version < min(READS):
        return (f"{where}: schema version {version}, exported by an older twostep whose decoder runs every row at "
                f"one position; this twostep reads version {SCHEMA_VERSION} (rows at different positions, so "
                "sentences can join a running batch): re-export it from its checkpoint with "
                "`twostep export CHECKPOINT --out DIR --force`")
    return (f"{where}: schema version {version!r:.40}, this twostep reads versions "
            f"{' and '.join(map(str, READS))}; re-export with this twostep or install the matching one")
