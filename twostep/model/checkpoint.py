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
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from twostep.artifact.config import ModelConfig
from twostep.artifact.manifest import parse_decoding
from twostep.artifact.tokenizer import TokenizerSpec
from twostep.errors import BadCheckpoint
from twostep.files import OutputKind, output_directory, read_json
from twostep.model.tensorfile import write_safetensors
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
    """The state dict with each tied tensor once, under its first name (safetensors refuses aliases). Ties are
    told by identity, not by address: a model assembled on the meta device has every address 0."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict(keep_vars=True).items():  # the parameters themselves: ties are one object
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor.detach()
    return out


_META = threading.Lock()


@contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no initialisation: a 3B model's
    random init took minutes and its whole size), their buffers (position tables, relative buckets) as usual."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), param.requires_grad)
        register(module, name, param)

    with _META:
        nn.Module.register_parameter = on_meta
        try:
            yield
        finally:
            nn.Module.register_parameter = register


def assemble(config: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> Transformer:
    """A model of `config` whose weights are `tensors` (canonical names), or one error listing every problem.
    The tensors become the model's own, not copies: memory-mapped safetensors stay mapped, paged in as they are
    read (twostep.model.sources). A tensor keeps its dtype: a bf16 or fp16 checkpoint's model holds bf16 or fp16
    weights (converted to float32 tensor by tensor where they are written, twostep.artifact.tensorfile)."""
    with parameters_on_meta():
        model = Transformer(config)
    expected = canonical_state_dict(model)
    problems = [f"missing tensor {name} {tuple(t.shape)}" for name, t in expected.items() if name not in tensors]
    problems += [f"unexpected tensor {name}" for name in tensors if name not in expected]
    problems += [
        f"tensor {name} has shape {tuple(tensors[name].shape)}, expected {tuple(t.shape)}"
        for name, t in expected.items()
        if name in tensors and tensors[name].shape != t.shape
    ]
    problems += [f"tensor {name} is {tensors[name].dtype}, expected {t.dtype}" for name, t in expected.items()
                 if name in tensors and tensors[name].is_floating_point() != t.is_floating_point()]
    if problems:
        raise BadCheckpoint(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    model.load_state_dict({name: tensors[name] for name in expected}, strict=False, assign=True)
    for buffer in model.buffers():  # computed in float32 (position tables): so they stay
        if buffer.is_floating_point() and buffer.dtype != torch.float32:
            buffer.data = buffer.data.float()
    if config.tie_generator:  # assigning replaced the tied parameter: tie it again
        model.generator.weight = model.tgt_embed.weight
    left = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"assembling {source} left {', '.join(left)} on the meta device")
    return model.eval()


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
    write_safetensors(out_dir / WEIGHTS_FILE, canonical_state_dict(model))  # tensor by tensor, in float32
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
        tensors = load_file(str(weights_file))  # memory-mapped: nothing is copied until it is read
    except (SafetensorError, OSError, ValueError) as exc:
        raise BadCheckpoint(f"{weights_file}: cannot read safetensors ({exc})") from None
    model = assemble(config, tensors, str(weights_file))
    info = {k: v for k, v in meta.items() if k not in ("format", "version", "task", "model")}
    return Checkpoint(path=path, model=model, task=meta.get("task"), info=info)
