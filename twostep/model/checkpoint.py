"""Checkpoints as a directory: `config.json`, `model.safetensors` and, when there is one, the tokenizer:
`tokenizer.model` (a SentencePiece model whose ids are the model's), or the files that config.json's
`tokenizer` section names (twostep.artifact.tokenizer: an imported model's SentencePiece models and vocabulary
tables).

Weights are safetensors only: loading a checkpoint never executes code. Every key and shape is checked
against the config, and all problems are reported in one error.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from twostep.artifact.config import ModelConfig
from twostep.artifact.manifest import parse_decoding
from twostep.artifact.tokenizer import TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.files import OutputKind, output_directory, read_json
from twostep.model.transformer import Transformer

FORMAT = "twostep-checkpoint"
VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.model"


@dataclass
class Checkpoint:
    path: Path
    model: Transformer
    task: str | None
    info: dict[str, Any]

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def tokenizer(self) -> TokenizerSpec | None:
        return tokenizer_spec(self.path, self.config, self.info.get("tokenizer"))

    @property
    def decoding(self) -> dict[str, Any] | None:
        """How the model decodes when a caller does not say (DecodeOptions field names -> values), or None."""
        return parse_decoding(self.info.get("decoding"), str(self.path / CONFIG_FILE), BadCheckpoint)


def tokenizer_spec(path: Path, config: ModelConfig, section: Any) -> TokenizerSpec | None:
    """A checkpoint's tokenizer: config.json's section, or for a tokenizer.model the plain SentencePiece one."""
    c = config
    if section is not None:
        return TokenizerSpec.parse(section, str(path / CONFIG_FILE), (c.src_vocab_size, c.tgt_vocab_size))
    if (path / TOKENIZER_FILE).is_file():
        return TokenizerSpec.sentencepiece(TOKENIZER_FILE, c.pad_id, c.unk_id, c.bos_id, c.eos_id)
    return None


def read_decoding(path: Path) -> dict[str, Any] | None:
    """The decoding defaults of the checkpoint at `path` (Checkpoint.decoding), without loading its weights."""
    return parse_decoding(read_config(path).get("decoding"), str(Path(path) / CONFIG_FILE), BadCheckpoint)


def read_tokenizer(path: Path) -> TokenizerSpec | None:
    """The tokenizer of the checkpoint at `path`, without loading its weights."""
    meta = read_config(path)
    return tokenizer_spec(Path(path), ModelConfig.from_dict(meta["model"]), meta.get("tokenizer"))


def canonical_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The state dict with each tied tensor once, under its first name (safetensors refuses aliases)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key not in seen:
            seen.add(key)
            out[name] = tensor
    return out


def load_weights(model: Transformer, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Load `tensors` (canonical names) into `model`, or raise one error listing every problem."""
    expected = canonical_state_dict(model)
    problems = [f"missing tensor {name} {tuple(t.shape)}" for name, t in expected.items() if name not in tensors]
    problems += [f"unexpected tensor {name}" for name in tensors if name not in expected]
    problems += [
        f"tensor {name} has shape {tuple(tensors[name].shape)}, expected {tuple(t.shape)}"
        for name, t in expected.items()
        if name in tensors and tensors[name].shape != t.shape
    ]
    if problems:
        raise BadCheckpoint(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for name, t in expected.items():
            t.copy_(tensors[name].to(t.dtype))


def owned_entries(path: Path) -> set[str] | None:
    """The entries of a checkpoint directory that twostep wrote; None when it is not a twostep checkpoint."""
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    spec = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    named = [spec.get(k) for k in ("source_model", "target_model", "source_vocab", "target_vocab")]
    return {CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE} | {n for n in named if isinstance(n, str) and "/" not in n}


CHECKPOINT = OutputKind("checkpoint", CONFIG_FILE, owned_entries)


def write_checkpoint(
    model: Transformer, out_dir: Path, tokenizer: Path | None = None, task: str | None = None,
    info: dict[str, Any] | None = None, tokenizer_files: dict[str, Path | bytes] | None = None,
) -> None:
    """Write the checkpoint's files into the (new, empty) directory `out_dir`. `tokenizer`: a SentencePiece
    model whose ids are the model's; `tokenizer_files`: the files an info["tokenizer"] section names, by name."""
    weights = {k: v.detach().cpu().contiguous() for k, v in canonical_state_dict(model).items()}
    try:
        save_file(weights, str(out_dir / WEIGHTS_FILE))
    except SafetensorError as exc:  # safetensors reports the OS's write errors as its own
        if "I/O error" not in str(exc):
            raise
        raise OSError(f"{WEIGHTS_FILE}: {exc}") from None  # reported by output_directory, naming the output
    meta = {"format": FORMAT, "version": VERSION, "task": task, "model": model.config.to_dict(), **(info or {})}
    (out_dir / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer is not None:
        shutil.copyfile(tokenizer, out_dir / TOKENIZER_FILE)
    for name, source in (tokenizer_files or {}).items():
        if isinstance(source, bytes):
            (out_dir / name).write_bytes(source)
        else:
            shutil.copyfile(source, out_dir / name)


def save_checkpoint(
    model: Transformer, out_dir: Path, tokenizer: Path | None = None, task: str | None = None,
    info: dict[str, Any] | None = None, force: bool = False, tokenizer_files: dict[str, Path | bytes] | None = None,
) -> Path:
    """Write the checkpoint atomically (twostep.files.output_directory): an existing directory is replaced
    only when it is a twostep checkpoint and `force` is given."""
    with output_directory(out_dir, CHECKPOINT, force) as tmp:
        write_checkpoint(model, tmp, tokenizer, task, info, tokenizer_files)
    return Path(out_dir)


def read_config(path: Path) -> dict[str, Any]:
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not path.is_dir():
        raise BadCheckpoint(f"{path}: not a checkpoint directory (expected a folder with {CONFIG_FILE})")
    if not config_file.is_file():
        raise BadCheckpoint(f"{path}: missing {CONFIG_FILE}; is this a twostep checkpoint?")
    meta = read_json(config_file, BadCheckpoint)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BadCheckpoint(f"{config_file}: not a twostep checkpoint config (format != {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise BadCheckpoint(f"{config_file}: checkpoint version {meta.get('version')!r}, this twostep reads {VERSION}")
    return meta


def load_checkpoint(path: Path | str) -> Checkpoint:
    path = Path(path)
    meta = read_config(path)
    config = ModelConfig.from_dict(meta["model"])
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        raise BadCheckpoint(f"{path}: missing {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(weights_file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise BadCheckpoint(f"{weights_file}: cannot read safetensors ({exc})") from None
    model = Transformer(config)
    load_weights(model, tensors, str(weights_file))
    model.eval()
    info = {k: v for k, v in meta.items() if k not in ("format", "version", "task", "model")}
    return Checkpoint(path=path, model=model, task=meta.get("task"), info=info)
