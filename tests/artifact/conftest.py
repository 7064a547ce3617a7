"""Fixtures of the artifact tests: a copy of the demo artifact to damage."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture()
def art_copy(demo_artifact, tmp_path):
    target = tmp_path / "art"
    shutil.copytree(demo_artifact, target)
    return target
