"""The artifact contract, the bottom layer every consumer reads: the model config, graph I/O declared once and
the graphs an artifact may hold (spec), the manifest (manifest), the trust rules (trust) and the directory
(store). Imports no torch and no runtime."""

from twostep.artifact.manifest import FORMAT, SCHEMA_VERSION, GraphEntry, Manifest
from twostep.artifact.store import ARTIFACT, ENGINES, MANIFEST, Artifact, load_artifact, write_manifest
from twostep.artifact.trust import check_ledger, record_ledger, sha256_file

__all__ = ["ARTIFACT", "ENGINES", "FORMAT", "MANIFEST", "SCHEMA_VERSION", "Artifact", "GraphEntry", "Manifest",
           "check_ledger", "load_artifact", "record_ledger", "sha256_file", "write_manifest"]
