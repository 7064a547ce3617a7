"""Pretrained translation models in Hugging Face transformers' format: a model directory (`config.json`, the
weights, the tokenizer's files) or a hub name in, a twostep checkpoint out. Needs no transformers: each family,
a module of this package registered by config.json's model_type (common.py's `family`), reads its files:

- marian.py: Marian (OPUS-MT)
- m2m100.py: M2M100 (and the NLLB directories its model_type also names, handed to nllb.py)
- nllb.py: NLLB-200
- mbart.py: mBART-50
- t5.py: T5, mT5 and MADLAD-400 (model_type t5, mt5)
"""

from __future__ import annotations

import re
from pathlib import Path

from twostep.errors import BadCheckpoint
from twostep.model.checkpoint import Checkpoint
from twostep.model.hf import m2m100, marian, mbart, nllb, t5  # noqa: F401  (each registers its family)
from twostep.model.hf.common import FAMILIES, HFModel, Imported, generation_decoding, save_imported

HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
             "pytorch_model.bin", "*.spm", "vocab.json", "target_vocab.json", "sentencepiece.bpe.model",
             "tokenizer_config.json", "tokenizer.json", "spiece.model"]


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_name(src: Path | str) -> bool:
    """ORG/NAME that is not a path here: a model of the Hugging Face hub."""
    return (not Path(src).exists() and HUB_NAME.fullmatch(str(src)) is not None
            and Path(src).suffix not in (".pt", ".pth", ".bin", ".ckpt", ".safetensors"))


def download(repo: str) -> Path:
    """A model of the Hugging Face hub (ORG/NAME), downloaded with huggingface_hub (the `hub` extra): only the
    files an import reads."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise BadCheckpoint(f"{repo}: no such directory; to download it from the Hugging Face hub, "
                            "pip install 'twostep[hub]'") from None
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, unknown repository, gated model: huggingface_hub raises many types
        raise BadCheckpoint(f"{repo}: cannot download it from the Hugging Face hub ({str(exc).splitlines()[0]})") \
            from None


def read_hf_directory(src: Path, fmt: str | None = None) -> tuple[Imported, Path]:
    """A transformers model directory (or a hub name ORG/NAME, downloaded) read, and the directory it was read from;
    the family is config.json's model_type unless `fmt` names it."""
    src = Path(src)
    if is_hub_name(src):
        src = download(str(src))
    hf = HFModel(src)
    name = fmt or hf.get("model_type")
    if name not in FAMILIES:
        raise BadCheckpoint(f"{hf.path / 'config.json'}: model_type {name!r} is not a family twostep imports; it "
                            f"imports {', '.join(sorted(FAMILIES))} (--format overrides model_type)")
    decoding = generation_decoding(hf)  # a setting it refuses stops the import before the weights are read
    imported = FAMILIES[name](hf)
    imported.family = imported.family or name
    imported.decoding = decoding
    return imported, hf.path


def import_hf_directory(src: Path, out_dir: Path, fmt: str | None = None, force: bool = False) -> Checkpoint:
    """Import a transformers model directory (or a hub name ORG/NAME) into a twostep checkpoint at out_dir."""
    imported, directory = read_hf_directory(src, fmt)
    return save_imported(imported, directory, out_dir, force)
