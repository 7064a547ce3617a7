"""Argos Translate packages (what LibreTranslate runs): a `.argosmodel` zip file, or the folder argostranslate
installs it as (`~/.local/share/argos-translate/packages/translate-en_fr-1_9/`), read in place, never extracted.

A package holds one folder (`translate-en_fr-1_9/`) with `metadata.json` (from_code, to_code, names, version,
optionally target_prefix), `model/` (a CTranslate2 model directory: twostep.model.ct2), argostranslate's
tokenizer on both sides, and usually `stanza/` (its sentence splitter, which twostep does not use: it splits
documents itself). The tokenizer is what package.py looks for, in its order: `sentencepiece.model`, else
`bpe.model` (OPUS-MT's models trained before SentencePiece: Moses tokenization in from_code's rules, then these
BPE codes; Moses detokenization in to_code's: tokenizer.py's BPETokenizer, the tokenizer kind moses-bpe). The
languages go into the tokenizer section, and the decoding defaults are argostranslate's (translate.py's
apply_packaged_translation): beam 4, length_penalty 0.2, CTranslate2's beam search, max_decoding_length 256; its
text is the tokenizer's (SentencePiece's with "▁" and "_" as spaces) with one leading space dropped. Argos's own codes
are recorded as the standard tags LibreTranslate shows them as (its language.py aliases: zt is zh-Hant, pb pt-BR,
zh zh-Hans), so a server lists and routes them as LibreTranslate does (and LibreTranslate's zt and pb reach them).
"""

from __future__ import annotations

import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from twostep.artifact.tokenizer import Languages, TargetLanguage
from twostep.errors import BadCheckpoint
from twostep.files import read_json
from twostep.model.ct2 import CT2Import, CT2Model, import_ct2
from twostep.model.hf.common import Imported

ARGOS_CODES = {"zt": "zh-Hant", "pb": "pt-BR", "zh": "zh-Hans"}  # LibreTranslate's language.py aliases

# argostranslate's translate_batch settings (translate.py, apply_packaged_translation; settings.py's beam size)
DECODING = {"beam_size": 4, "length_penalty": 0.2, "beam_stop": "ctranslate2", "max_new_tokens": 256,
            "min_new_tokens": 1,  # translate_batch's min_decoding_length default
            "replace_unknowns": True}


def is_package(src: Path) -> bool:
    """An .argosmodel file, a zip file with metadata.json in it or its one folder (a torch.save file is a zip
    too), or a folder (or a folder holding one folder) with metadata.json and model/."""
    if src.is_file():
        return src.suffix == ".argosmodel" or zipfile.is_zipfile(src) and has_metadata(src)
    return src.is_dir() and package_folder(src) is not None


def has_metadata(src: Path) -> bool:
    try:
        with zipfile.ZipFile(src) as archive:
            return any(PurePosixPath(n).name == "metadata.json" and len(PurePosixPath(n).parts) <= 2
                       for n in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def package_folder(src: Path) -> Path | None:
    if (src / "metadata.json").is_file() and (src / "model").is_dir():
        return src
    inner = [d for d in src.iterdir() if d.is_dir() and (d / "metadata.json").is_file()] if src.is_dir() else []
    return inner[0] if len(inner) == 1 and (inner[0] / "model").is_dir() else None


def open_zip(src: Path) -> tuple[zipfile.ZipFile, zipfile.Path]:
    """The zip file and its package folder; every member's name must stay inside the package."""
    try:
        archive = zipfile.ZipFile(src)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadCheckpoint(f"{src}: not a readable zip file ({exc})") from None
    for name in archive.namelist():
        path = PurePosixPath(name.replace("\\", "/"))
        if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
            archive.close()
            raise BadCheckpoint(f"{src}: the member {name!r} escapes the package; not an Argos package to trust")
    tops = {PurePosixPath(n).parts[0] for n in archive.namelist() if PurePosixPath(n).parts}
    if "metadata.json" in archive.namelist():
        return archive, zipfile.Path(archive)
    folders = [t for t in tops if f"{t}/metadata.json" in archive.namelist()]
    if len(folders) != 1:
        archive.close()
        raise BadCheckpoint(f"{src}: no metadata.json in one top-level folder; not an Argos Translate package")
    return archive, zipfile.Path(archive, at=f"{folders[0]}/")


def read_metadata(root: Path | zipfile.Path) -> dict[str, Any]:
    metadata = read_json(root / "metadata.json", BadCheckpoint)
    if not isinstance(metadata, dict):
        raise BadCheckpoint(f"{root / 'metadata.json'}: expected a JSON object")
    kind = metadata.get("type", "translate")
    if kind != "translate":
        raise BadCheckpoint(f"{root / 'metadata.json'}: a {kind!r} package; twostep imports translate packages")
    for key in ("from_code", "to_code"):
        if not isinstance(metadata.get(key), str) or not metadata[key]:
            raise BadCheckpoint(f"{root / 'metadata.json'}: no {key}; an Argos translate package names its "
                                "languages (from_code, to_code)")
    return metadata


def import_package(src: Path) -> Imported:
    """An Argos package (zip or folder) as a twostep model and tokenizer section, with argostranslate's decoding."""
    if src.is_file():
        archive, root = open_zip(src)
    else:
        archive, root = None, package_folder(src)
        if root is None:
            raise BadCheckpoint(f"{src}: no metadata.json and model/; not an Argos Translate package")
    try:
        metadata = read_metadata(root)
        # package.py's order: sentencepiece.model, else bpe.model (BPETokenizer, with the package's own codes)
        if (root / "sentencepiece.model").is_file():
            tokenizer = {"source_spm": root / "sentencepiece.model"}
        elif (root / "bpe.model").is_file():
            tokenizer = {"bpe_codes": root / "bpe.model", "moses": (metadata["from_code"], metadata["to_code"])}
        else:
            raise BadCheckpoint(f"{src}: no sentencepiece.model or bpe.model in the package; argostranslate "
                                "tokenizes with one of them")
        model_dir = root / "model"
        source, target = (ARGOS_CODES.get(metadata[key], metadata[key]) for key in ("from_code", "to_code"))
        how = CT2Import(
            **tokenizer,
            languages=Languages(source={source: ()}, target={target: TargetLanguage()}, default_source=source,
                                default_target=target),
            target_prefix=metadata.get("target_prefix") or None, decoding=dict(DECODING), detokenize="argos")
        imported = import_ct2(CT2Model.read(model_dir), how)
    finally:
        if archive is not None:
            archive.close()
    imported.family = "argos"
    imported.notes.append("stanza/ (argostranslate's sentence splitter) is not used: twostep splits documents into "
                          "sentences itself")
    imported.decoding = dict(DECODING)
    imported.source = {"package": metadata.get("code") or f"translate-{metadata['from_code']}_{metadata['to_code']}",
                       "package_version": metadata.get("package_version"), "from_code": metadata["from_code"],
                       "to_code": metadata["to_code"],
                       "from_name": metadata.get("from_name"), "to_name": metadata.get("to_name")}
    return imported
