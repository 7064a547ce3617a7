"""The artifact directory: the contract every consumer reads (Python backends, CLI, services, C++).

    encoder.onnx, decoder.onnx   the two graphs (see twostep.exporter.spec)
    decoder_inplace.onnx         optional (`variants`): an ONNX Runtime-only decoder that writes its cache in
                                 place (twostep.exporter.inplace); the two graphs stay the contract
    tokenizer.model              SentencePiece model, when the checkpoint had one
    manifest.json                schema version, model config, special ids, graph I/O, opset, versions,
                                 sha256 of every file, max positions, validation tolerances
    engines/                     TensorRT engines built on first use, each checked against its own record;
                                 ONNX Runtime's TensorRT cache (engines/ort-trt/) against a ledger

Trust: nothing the manifest says is taken on faith. Every file the runtime opens (both graphs, their ONNX
external data, the tokenizer) must be listed in `files` with its sha256, and every listed name must be a
plain relative path that stays inside the directory, symbolic links included. The graphs' I/O must be
exactly what the model config implies. `cpp/src/manifest.cpp` enforces the same rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twostep.errors import BadArtifact, BadCheckpoint
from twostep.exporter.spec import INPLACE, GraphSpec, graph_specs, inplace_spec
from twostep.files import OLD, OutputKind, write_file_atomic
from twostep.model.config import ModelConfig

FORMAT = "twostep-artifact"
# 2: the decoder takes past_lengths [batch], so that rows of one batch can be at different positions (a sentence
# joins a running batch). 1: every row at the cache's one position.
SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
ENGINES = "engines"
GRAPH_FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
DTYPES = ("float32", "float16")
PRECISIONS = ("fp32", "fp16", "int8")
SHA256 = re.compile(r"[0-9a-f]{64}")


def sha256_file(path: Path) -> str:
    return read_digest(path)[0]


def read_digest(path: Path, marker: bytes = b"") -> tuple[str, bool]:
    """A file's sha256, and whether `marker` occurs in it, in one read."""
    digest, found, tail = hashlib.sha256(), False, b""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            if marker and not found:
                found = marker in tail + block[: len(marker) - 1] or marker in block
                tail = block[-(len(marker) - 1):]
    return digest.hexdigest(), found


@dataclass
class Artifact:
    path: Path
    manifest: dict[str, Any]
    config: ModelConfig
    graphs: dict[str, GraphSpec]
    variants: dict[str, GraphSpec] = dataclasses.field(default_factory=dict)  # e.g. decoder_inplace

    def file(self, name: str) -> Path:
        return self.path / name

    def graph_file(self, graph: str) -> Path:
        """A graph's file: one of the two, or a variant (decoder_inplace)."""
        return self.path / graph_entry(self.manifest, graph)["file"]

    def graph_sha256(self, graph: str) -> str:
        return self.manifest["files"][self.manifest["graphs"][graph]["file"]]

    @property
    def tokenizer_path(self) -> Path | None:
        name = self.manifest.get("tokenizer")
        return self.path / name if name else None

    @property
    def dtype(self) -> str:
        """The graphs' float I/O dtype."""
        return self.manifest["dtype"]

    @property
    def precision(self) -> str:
        """The weights' precision: fp32, fp16 or int8."""
        return self.manifest.get("precision", "fp32")

    def engine_dir(self, *parts: str) -> Path:
        """A directory under engines/ for built engines, created on demand; it must be a real directory
        inside the artifact, never a link that would send writes elsewhere."""
        path = self.path
        for part in (ENGINES, *parts):
            path = path / part
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                raise BadArtifact(f"{path}: expected a directory of engines that twostep builds, found a "
                                  "link or a file; remove it to let twostep rebuild its engines")
            try:
                path.mkdir(exist_ok=True)
            except OSError as exc:
                raise BadArtifact(f"{path}: cannot create the engine cache ({exc.strerror}); engines are built "
                                  "into the artifact directory, so it must be writable") from None
        return path


def safe_name(name: Any, where: str) -> str:
    """A plain relative path inside the artifact: parts separated by '/', none empty, '.' or '..' (so no
    absolute path), no backslash or control character, valid UTF-8. cpp/src/manifest.cpp: check_name."""
    parts = name.split("/") if isinstance(name, str) else [""]
    plain = (all(p not in ("", ".", "..") for p in parts) and "\\" not in name
             and not any(ord(c) < 32 or ord(c) == 127 for c in name) and is_utf8(name))
    if not plain:
        raise BadArtifact(f"{where}: file name {name!r:.80} must be a plain relative path inside the artifact "
                          "(no absolute path, no '..')")
    return name


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return True


def inside(root: Path, name: str, where: str) -> Path:
    """`root / name`, refused when a symbolic link on the way leads outside `root`."""
    path = root / name
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop
        raise BadArtifact(f"{path}: cannot resolve it ({exc})") from None
    if os.path.commonpath([resolved, root.resolve()]) != str(root.resolve()):
        raise BadArtifact(f"{path}: leads outside the artifact directory (to {resolved}); artifacts must "
                          f"hold their files themselves ({where})")
    return path


def external_data_locations(graph_file: Path) -> set[str]:
    """The files an ONNX graph keeps tensors in (external data), from every tensor it holds: initializers,
    sparse initializers, Constant-style attributes, subgraphs and functions."""
    import onnx

    try:
        model = onnx.load(str(graph_file), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends: a damaged graph
        raise BadArtifact(f"{graph_file}: not a readable ONNX model ({str(exc).splitlines()[0][:200]})") from None

    def graph_tensors(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in graph.node:
            yield from node_tensors(node)

    def node_tensors(node):
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for sparse in [a.sparse_tensor] * a.HasField("sparse_tensor") + list(a.sparse_tensors):
                yield from (sparse.values, sparse.indices)
            for sub in [a.g] * a.HasField("g") + list(a.graphs):
                yield from graph_tensors(sub)

    tensors = list(graph_tensors(model.graph))
    tensors += [t for function in model.functions for node in function.node for t in node_tensors(node)]
    out = set()
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            entries = {e.key: e.value for e in tensor.external_data}
            if "location" not in entries:
                raise BadArtifact(f"{graph_file}: tensor {tensor.name!r} has external data without a location")
            out.add(entries["location"])
    return out


def field(data: dict, key: str, types: type | tuple[type, ...], where: str, choices: tuple = ()) -> Any:
    if key not in data:
        raise BadArtifact(f"{where}: malformed manifest (missing {key!r})")
    value = data[key]
    if not isinstance(value, types) or isinstance(value, bool):
        raise BadArtifact(f"{where}: malformed manifest ({key!r} is {type(value).__name__} {value!r:.60})")
    if choices and value not in choices:
        raise BadArtifact(f"{where}: malformed manifest ({key!r} is {value!r:.60}, expected one of {choices})")
    return value


def schema_message(where: str, version: Any) -> str:
    """Why an artifact of another schema version cannot be read, and what to do. cpp/src/manifest.cpp says the
    same."""
    if isinstance(version, int) and not isinstance(version, bool) and 1 <= version < SCHEMA_VERSION:
        return (f"{where}: schema version {version}, exported by an older twostep whose decoder runs every row at "
                f"one position; this twostep reads version {SCHEMA_VERSION} (rows at different positions, so "
                "sentences can join a running batch): re-export it from its checkpoint with "
                "`twostep export CHECKPOINT --out DIR --force`")
    return (f"{where}: schema version {version!r:.40}, this twostep reads version {SCHEMA_VERSION}; re-export "
            "with this twostep or install the matching one")


def parse_manifest(manifest: Any, where: str) -> tuple[ModelConfig, dict[str, GraphSpec]]:
    """Check every part of the manifest that a consumer relies on; any problem is a BadArtifact."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadArtifact(f"{where}: not a twostep manifest (format != {FORMAT!r})")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BadArtifact(schema_message(where, version))
    try:
        config = ModelConfig.from_dict(field(manifest, "model", dict, where))
    except BadCheckpoint as exc:
        raise BadArtifact(f"{where}: malformed manifest ({exc})") from None
    dtype = field(manifest, "dtype", str, where, DTYPES)
    if "precision" in manifest:
        field(manifest, "precision", str, where, PRECISIONS)
    if field(manifest, "max_positions", int, where) != config.max_positions:
        raise BadArtifact(f"{where}: malformed manifest (max_positions differs from model.max_positions)")
    field(manifest, "opset", int, where)
    if manifest.get("tokenizer") is not None:
        safe_name(manifest["tokenizer"], where)
    files = field(manifest, "files", dict, where)
    for name, digest in files.items():
        safe_name(name, where)
        if not isinstance(digest, str) or not SHA256.fullmatch(digest):
            raise BadArtifact(f"{where}: malformed manifest (sha256 of {name!r} is {digest!r:.80})")
    graphs = field(manifest, "graphs", dict, where)
    specs = graph_specs(config, dtype)
    for name, spec in specs.items():
        graph = field(graphs, name, dict, f"{where}: graphs")
        safe_name(field(graph, "file", str, f"{where}: graphs.{name}"), where)
        if {k: graph.get(k) for k in ("inputs", "outputs")} != spec.to_dict():
            raise BadArtifact(f"{where}: graphs.{name} inputs/outputs are not those the model config implies; "
                              "the manifest was edited or is damaged: re-export the artifact")
    return config, specs


def parse_variants(manifest: dict[str, Any], config: ModelConfig, where: str) -> dict[str, GraphSpec]:
    """The optional runtime-specific graphs this twostep knows (others, from a newer one, are ignored)."""
    variants = manifest.get("variants", {})  # artifacts of an older twostep have none
    if not isinstance(variants, dict):
        raise BadArtifact(f"{where}: malformed manifest ('variants' is {type(variants).__name__})")
    out = {}
    if INPLACE in variants:
        entry = field(variants, INPLACE, dict, f"{where}: variants")
        safe_name(field(entry, "file", str, f"{where}: variants.{INPLACE}"), where)
        spec = inplace_spec(config, manifest["dtype"])
        if {k: entry.get(k) for k in ("inputs", "outputs")} != spec.to_dict():
            raise BadArtifact(f"{where}: variants.{INPLACE} inputs/outputs are not those the model config implies; "
                              "the manifest was edited or is damaged: re-export the artifact")
        out[INPLACE] = spec
    return out


def graph_entry(manifest: dict[str, Any], graph: str) -> dict[str, Any]:
    return manifest["variants"][graph] if graph not in GRAPH_FILES else manifest["graphs"][graph]


def graph_names(manifest: dict[str, Any], variants: Iterable[str] = ()) -> list[str]:
    """The files of both graphs and of the variants this twostep knows."""
    return [graph_entry(manifest, g)["file"] for g in (*GRAPH_FILES, *variants)]


def opened_files(manifest: dict[str, Any], variants: Iterable[str] = ()) -> list[str]:
    """The files the runtime opens itself: the graphs (graph_names) and the tokenizer."""
    return graph_names(manifest, variants) + ([manifest["tokenizer"]] if manifest.get("tokenizer") else [])


def missing_hint(path: Path) -> str:
    """What to say about a missing artifact directory: an interrupted replacement leaves the old one aside."""
    olds = sorted(path.parent.glob(f".{path.name}.{OLD}-*")) if path.name else []
    if olds:
        return (f"; an interrupted `twostep export` left the previous artifact at {olds[-1]}: run the export "
                "again (it puts it back first) or rename it to " + str(path))
    return "; create one with `twostep export`"


def load_artifact(path: Path | str, check_hashes: bool = True) -> Artifact:
    """Read and check an artifact directory; every problem is a BadArtifact naming the file.

    `check_hashes=False` reads the manifest only (inspect, planning a benchmark): names are still checked,
    but no file is opened. Every consumer that opens the graphs loads with the full check."""
    path = Path(path)
    manifest_file = path / MANIFEST
    where = str(manifest_file)
    if not path.is_dir():
        raise BadArtifact(f"{path}: not an artifact directory (expected a folder with {MANIFEST})" + missing_hint(path))
    if not manifest_file.is_file():
        raise BadArtifact(f"{path}: missing {MANIFEST}; create the directory with `twostep export`")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadArtifact(f"{manifest_file}: not valid JSON ({str(exc)[:200]})") from None
    except OSError as exc:
        raise BadArtifact(f"{manifest_file}: cannot read it ({exc.strerror})") from None
    config, graphs = parse_manifest(manifest, where)
    variants = parse_variants(manifest, config, where)
    files = manifest["files"]
    for name in opened_files(manifest, variants):
        if name not in files:
            raise BadArtifact(f"{where}: {name} is not listed in 'files' with its sha256; the runtime opens "
                              "only listed, hashed files: re-export the artifact")
    graph_files = set(graph_names(manifest, variants))
    may_have_external_data = []  # every external-data reference holds the key "location": no key, no reference
    for name, expected in files.items():
        file = inside(path, name, f"listed in {MANIFEST}")
        try:
            if not file.is_file():
                raise BadArtifact(f"{file}: missing (listed in {MANIFEST})")
            if not check_hashes:
                continue
            digest, mentions_location = read_digest(file, b"location" if name in graph_files else b"")
            if digest != expected:
                raise BadArtifact(f"{file}: sha256 does not match {MANIFEST}; the file was changed or damaged, "
                                  "re-export the artifact")
            if mentions_location:
                may_have_external_data.append(file)
        except OSError as exc:  # unreadable, or a name the filesystem refuses
            raise BadArtifact(f"{file}: cannot read it ({exc.strerror})") from None
    for graph_file in may_have_external_data:
        for location in sorted(external_data_locations(graph_file)):
            safe_name(location, f"{graph_file}: external data")
            if location not in files:
                raise BadArtifact(f"{graph_file}: its external data {location!r} is not listed in {MANIFEST} "
                                  "with a sha256; the runtime opens only listed, hashed files")
    return Artifact(path=path, manifest=manifest, config=config, graphs=graphs, variants=variants)


def ledger_file(directory: Path) -> Path:
    return directory.with_name(directory.name + ".sha256.json")


def check_ledger(directory: Path) -> None:
    """Before a library opens an engine cache it writes itself (ONNX Runtime's TensorRT provider): every
    file there must be one that twostep recorded after an earlier run, with the same sha256."""
    ledger = ledger_file(directory)
    try:
        recorded = json.loads(ledger.read_text()) if ledger.exists() else {}
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):
        raise BadArtifact(f"{ledger}: not a record of the engine cache; delete it and {directory} to rebuild")
    for file in sorted(directory.rglob("*")):
        if file.is_dir() and not file.is_symlink():
            continue
        name = file.relative_to(directory).as_posix()
        if file.is_symlink() or not file.is_file() or recorded.get(name) != sha256_file(file):
            raise BadArtifact(f"{file}: not in {ledger.name} with this sha256 (the engine cache holds a file that "
                              f"twostep did not record, or it changed); delete {directory} to rebuild")


def record_ledger(directory: Path) -> None:
    """After the library has written its cache: record every file with its sha256."""
    files = {f.relative_to(directory).as_posix(): sha256_file(f) for f in sorted(directory.rglob("*"))
             if f.is_file() and not f.is_symlink()}
    try:
        write_file_atomic(ledger_file(directory), (json.dumps(files, indent=2) + "\n").encode())
    except OSError as exc:
        raise BadArtifact(f"{ledger_file(directory)}: cannot record the engine cache ({exc.strerror})") from None


def owned_entries(path: Path) -> set[str] | None:
    """The entries of an artifact directory that twostep wrote (manifest, listed files, engines/)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    return {MANIFEST, ENGINES} | {name.split("/")[0] for name in files if isinstance(name, str)}


ARTIFACT = OutputKind("artifact", MANIFEST, owned_entries)


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    files = sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {**manifest, "files": {name: sha256_file(path / name) for name in files}}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
