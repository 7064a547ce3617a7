"""The artifact directory: the contract every consumer reads (Python backends, CLI, services, C++).

    encoder.onnx, decoder.onnx   the two graphs (see twostep.exporter.spec)
    tokenizer.model              SentencePiece model, when the checkpoint had one
    manifest.json                schema version, model config, special ids, graph I/O, opset, versions,
                                 sha256 of every file, max positions, validation tolerances
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twostep.errors import BadArtifact
from twostep.exporter.spec import GraphSpec
from twostep.model.config import ModelConfig

FORMAT = "twostep-artifact"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
GRAPH_FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Artifact:
    path: Path
    manifest: dict[str, Any]
    config: ModelConfig
    graphs: dict[str, GraphSpec]

    def file(self, name: str) -> Path:
        return self.path / name

    def graph_file(self, graph: str) -> Path:
        return self.path / self.manifest["graphs"][graph]["file"]

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


def load_artifact(path: Path | str, check_hashes: bool = True) -> Artifact:
    """Read and check an artifact directory; every problem is a BadArtifact naming the file."""
    path = Path(path)
    manifest_file = path / MANIFEST
    if not path.is_dir():
        raise BadArtifact(f"{path}: not an artifact directory (expected a folder with {MANIFEST}); "
                          "create one with `twostep export`")
    if not manifest_file.is_file():
        raise BadArtifact(f"{path}: missing {MANIFEST}; create the directory with `twostep export`")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadArtifact(f"{manifest_file}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadArtifact(f"{manifest_file}: not a twostep manifest (format != {FORMAT!r})")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BadArtifact(f"{manifest_file}: schema version {version!r}, this twostep reads version "
                          f"{SCHEMA_VERSION}; re-export with this twostep or install the matching one")
    try:
        config = ModelConfig.from_dict(manifest["model"])
        graphs = {name: GraphSpec.from_dict(name, manifest["graphs"][name]) for name in GRAPH_FILES}
        files = dict(manifest["files"])
    except (KeyError, TypeError) as exc:
        raise BadArtifact(f"{manifest_file}: malformed manifest (missing or wrong {exc})") from None
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise BadArtifact(f"{file}: missing (listed in {MANIFEST})")
        if check_hashes and sha256_file(file) != expected:
            raise BadArtifact(f"{file}: sha256 does not match {MANIFEST}; the file was changed or damaged, "
                              "re-export the artifact")
    return Artifact(path=path, manifest=manifest, config=config, graphs=graphs)


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    files = sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {**manifest, "files": {name: sha256_file(path / name) for name in files}}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
