"""Argos Translate packages (twostep/model/argos.py): what metadata.json and the zip's member names may hold,
beside test_ct2.py's imports and refusals of whole packages."""

from __future__ import annotations

import json
import re
import shutil
import zipfile

import pytest

from twostep.errors import BadCheckpoint
from twostep.model.argos import import_package, open_zip, read_metadata

METADATA = {"type": "translate", "from_code": "en", "to_code": "fr"}


@pytest.mark.parametrize("member", ["/etc/evil.txt", "translate-en_fr/../../evil.txt", "C:/evil.txt",
                                    "\\evil.txt"])
def test_a_member_outside_the_package_is_refused(tmp_path, member):
    """An absolute path, a parent, a drive: whatever a careless extractor would write outside the package."""
    package = tmp_path / "p.argosmodel"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("translate-en_fr/metadata.json", json.dumps(METADATA))
        archive.writestr(member, "outside")
    with pytest.raises(BadCheckpoint, match=re.escape(f"the member {member!r} escapes the package")):
        open_zip(package)


def test_a_package_of_another_type_is_refused(tmp_path):
    """argostranslate's packages also hold sentence boundary detection models (type "sbd")."""
    (tmp_path / "metadata.json").write_text(json.dumps({**METADATA, "type": "sbd"}))
    with pytest.raises(BadCheckpoint, match="a 'sbd' package; twostep imports translate packages"):
        read_metadata(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"from_code": "en", "to_code": "fr"}))
    assert read_metadata(tmp_path)["to_code"] == "fr"  # no type: translate, as argostranslate reads it


def test_target_prefix_is_forced_after_the_decoders_start(ct2_models, tmp_path):
    """A multilingual package's target_prefix token starts every target sentence, and is dropped from its text."""
    package = tmp_path / "package"
    shutil.copytree(ct2_models.argos_dir, package)
    vocab = json.loads((package / "model" / "shared_vocabulary.json").read_text())
    metadata = json.loads((package / "metadata.json").read_text())
    prefix = vocab[10]
    (package / "metadata.json").write_text(json.dumps({**metadata, "target_prefix": prefix}))
    spec = import_package(package).tokenizer
    assert spec.languages.target["fr"].decoder == (10,)
    assert 10 in spec.drop_ids
    (package / "metadata.json").write_text(json.dumps({**metadata, "target_prefix": ""}))  # "": none
    assert import_package(package).tokenizer.languages.target["fr"].decoder == ()
