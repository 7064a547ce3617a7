"""The trust rules: nothing an artifact directory says is taken on faith.

Every file the runtime opens (the graphs, their ONNX external data, the tokenizer) must be listed in the manifest's
`files` with its sha256, and every listed name must be a plain relative path that stays inside the directory,
symbolic links included. Engine caches that a library writes itself (ONNX Runtime's TensorRT provider) are checked
against a ledger of what twostep recorded. `cpp/src/manifest.cpp` enforces the same rules.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from twostep.errors import BadArtifact
from twostep.files import write_file_atomic


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
