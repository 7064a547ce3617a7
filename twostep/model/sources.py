"""`twostep import DIR`: which kind of model a directory (or package file) holds, and its import into a twostep
checkpoint. One registry, tried in order: an Argos Translate package (twostep.model.argos), a CTranslate2 model
directory (twostep.model.ct2), a transformers directory (twostep.model.hf, whose families are keyed by
config.json's model_type). `--format` names one: argos, ctranslate2, or a transformers model_type."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from twostep.errors import BadCheckpoint
from twostep.model import argos
from twostep.model.checkpoint import Checkpoint
from twostep.model.ct2 import CT2Model, find_spm, import_ct2
from twostep.model.hf import is_hub_name, read_hf_directory
from twostep.model.hf.common import Imported, save_imported


def is_ct2_directory(src: Path) -> bool:
    return src.is_dir() and (src / "model.bin").is_file()


def import_ct2_directory(src: Path, tokenizer: Path | None, target_tokenizer: Path | None) -> Imported:
    if not src.is_dir():
        raise BadCheckpoint(f"{src}: not a directory; a CTranslate2 model is a directory with model.bin")
    return import_ct2(CT2Model.read(src), find_spm(src, tokenizer, target_tokenizer))


# name -> (whether a path holds this kind, its import): tried in this order
FORMATS: dict[str, tuple[Callable[[Path], bool], Callable[[Path, Path | None, Path | None], Imported]]] = {
    "argos": (argos.is_package, lambda src, *_: argos.import_package(src)),
    "ctranslate2": (is_ct2_directory, import_ct2_directory),
}


def is_model_source(src: Path) -> bool:
    """Whether `twostep import` reads `src` as a model directory or package (not a state dict file)."""
    return src.is_dir() or is_hub_name(src) or argos.is_package(src)


def import_model(src: Path, out_dir: Path, fmt: str | None = None, force: bool = False,
                 tokenizer: Path | None = None, target_tokenizer: Path | None = None,
                 src_lang: str | None = None, tgt_lang: str | None = None) -> Checkpoint:
    """Import a model directory or package (`fmt`: its kind, else found) into a twostep checkpoint at out_dir;
    `src_lang`, `tgt_lang` name (or rename) a bilingual model's pair (Languages.named)."""
    src = Path(src)
    name = fmt if fmt in FORMATS else None if fmt else next((n for n, (holds, _) in FORMATS.items() if holds(src)),
                                                            None)
    if name is None:
        imported, directory = read_hf_directory(src, fmt)
    else:
        imported, directory = FORMATS[name][1](src, tokenizer, target_tokenizer), src
        imported.family = imported.family or name
    if src_lang is not None or tgt_lang is not None:
        languages = imported.tokenizer.languages.named(src_lang, tgt_lang)
        imported.tokenizer = dataclasses.replace(imported.tokenizer, languages=languages)
    return save_imported(imported, directory, out_dir, force)
