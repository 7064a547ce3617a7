"""The artifact directory: the contract every consumer reads (Python backends, CLI, services, C++).

    encoder.onnx, decoder.onnx   the two graphs (twostep.artifact.spec)
    decoder_inplace.onnx         a variant, written where the model allows it: an ONNX Runtime-only decoder that
                                 writes its cache in place (twostep.exporter.inplace); the weights it shares with
                                 decoder.onnx are ONNX external data inside decoder.onnx, not a second copy
    tokenizer files              the SentencePiece model(s) and vocabulary tables the manifest's tokenizer
                                 section names (twostep.artifact.tokenizer), when the checkpoint had them
    manifest.json                schema version, model config, special ids, graph I/O, opset, versions,
                                 sha256 of every file, max positions, validation tolerances (twostep.artifact.manifest)
    engines/                     TensorRT engines built on first use, each checked against its own record;
                                 ONNX Runtime's TensorRT cache (engines/ort-trt/) against a ledger

Trust: nothing the manifest says is taken on faith (twostep.artifact.trust); the graphs' I/O must be exactly
what the model config implies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from twostep.artifact.config import ModelConfig
from twostep.artifact.manifest import FORMAT, GraphEntry, Manifest
from twostep.artifact.spec import CONTRACT, GraphSpec
from twostep.artifact.tokenizer import TokenizerSpec
from twostep.artifact.trust import external_data_locations, inside, read_digest, safe_name, sha256_file
from twostep.errors import BadArtifact
from twostep.files import OLD, OutputKind, read_json

MANIFEST = "manifest.json"
ENGINES = "engines"


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Manifest

    @property
    def config(self) -> ModelConfig:
        return self.manifest.config

    @property
    def graphs(self) -> dict[str, GraphSpec]:
        """The contract's two graphs (encoder, decoder): what every backend can run."""
        return {name: self.manifest.graphs[name].spec for name in CONTRACT}

    @property
    def variants(self) -> dict[str, GraphSpec]:
        """The runtime-specific graphs beside them that this twostep knows (decoder_inplace)."""
        return {name: entry.spec for name, entry in self.manifest.variants.items()}

    def entry(self, graph: str) -> GraphEntry | None:
        return self.manifest.graphs.get(graph)

    def file(self, name: str) -> Path:
        return self.path / name

    def graph_file(self, graph: str) -> Path:
        return self.path / self.manifest.graphs[graph].file

    def graph_sha256(self, graph: str) -> str:
        return self.manifest.files[self.manifest.graphs[graph].file]

    @property
    def tokenizer(self) -> TokenizerSpec | None:
        return self.manifest.tokenizer

    @property
    def dtype(self) -> str:
        return self.manifest.dtype

    @property
    def precision(self) -> str:
        return self.manifest.precision

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
    manifest = Manifest.parse(read_json(manifest_file, BadArtifact), where)
    files = manifest.files
    for name in manifest.opened_files():
        if name not in files:
            raise BadArtifact(f"{where}: {name} is not listed in 'files' with its sha256; the runtime opens "
                              "only listed, hashed files: re-export the artifact")
    graph_files = set(manifest.graph_files())
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
    return Artifact(path=path, manifest=manifest)


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


def write_manifest(path: Path, manifest: Manifest) -> Manifest:
    """Write manifest.json with the sha256 of every file in `path`; returns the manifest as written."""
    files = sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = manifest.replace(files={name: sha256_file(path / name) for name in files})
    (path / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest
