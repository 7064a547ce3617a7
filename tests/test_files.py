"""Output directories: twostep never deletes or overwrites what it did not write, replaces its own earlier
output only with --force and atomically, and reports every OS error as one line with nothing half-written."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import reference_models as ref
from cli_helpers import assert_user_error, leftovers, twostep
from twostep.artifact import load_artifact
from twostep.model.checkpoint import load_checkpoint


def user_files(directory):
    """A directory of someone's own work."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notes.txt").write_text("my notes")
    (directory / "data").mkdir(exist_ok=True)
    (directory / "data" / "train.tsv").write_text("a\tb\n")
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def snapshot(directory):
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", ["export", "init", "import", "train"])
def test_a_directory_of_user_files_is_never_replaced(tmp_path, tiny_ckpt, command):
    out = tmp_path / "work"
    before = user_files(out)
    if command == "import":
        torch.save(ref.build_nn_transformer(1, 1, emb_size=16, nhead=2, src_vocab_size=20, tgt_vocab_size=20,
                                            dim_feedforward=32).state_dict(), tmp_path / "tutorial.pt")
    args = {
        "export": ("export", tiny_ckpt, "--out", out),
        "init": ("init", "--preset", "tiny", "--vocab", "50", "--out", out),
        "import": ("import", tmp_path / "tutorial.pt", "--format", "nn-transformer", "--heads", "2", "--out", out),
        "train": ("train", "--preset", "tiny", "--steps", "1", "--out", out),
    }[command]
    for force in ((), ("--force",)):
        assert_user_error(twostep(*args, *force), f"{out} exists and is not a twostep")
        assert snapshot(out) == before
    assert leftovers(tmp_path) == [] and not (tmp_path / "work.train").exists()


def test_export_to_the_current_directory_is_refused(tmp_path, tiny_ckpt):
    before = user_files(tmp_path / "project")
    result = subprocess.run([sys.executable, "-m", "twostep.cli", "export", str(tiny_ckpt), "--out", "."],
                            cwd=tmp_path / "project", capture_output=True, text=True, timeout=300)
    assert_user_error(result, "exists and is not a twostep artifact", "choose another --out")
    assert snapshot(tmp_path / "project") == before


def test_an_earlier_artifact_needs_force_and_is_replaced_whole(tmp_path, tiny_artifact):
    art, ckpt = tiny_artifact
    out = tmp_path / "art"
    shutil.copytree(art, out)  # an earlier export (one export fewer than writing it here)
    first = json.loads((out / "manifest.json").read_text())["exporter"]["created"]
    assert_user_error(twostep("export", ckpt, "--out", out), "already holds a twostep artifact", "--force")
    (out / "engines").mkdir()  # twostep's own engine cache goes with the artifact
    result = twostep("export", ckpt, "--out", out, "--force")
    assert result.returncode == 0, result.stderr
    load_artifact(out)
    assert not (out / "engines").exists()
    assert json.loads((out / "manifest.json").read_text())["exporter"]["created"] >= first
    assert leftovers(tmp_path) == []


def test_an_artifact_holding_user_files_is_not_replaced_even_with_force(tmp_path, tiny_artifact):
    art, ckpt = tiny_artifact
    out = tmp_path / "art"
    shutil.copytree(art, out)
    (out / "my-results.csv").write_text("1,2\n")
    before = snapshot(out)
    assert_user_error(twostep("export", ckpt, "--out", out, "--force"), "also holds files twostep did not write",
                      "my-results.csv")
    assert snapshot(out) == before


def test_a_checkpoint_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "ck"
    assert twostep("init", "--preset", "tiny", "--vocab", "50", "--out", out).returncode == 0
    assert_user_error(twostep("init", "--preset", "tiny", "--vocab", "60", "--out", out), "--force")
    assert load_checkpoint(out).config.src_vocab_size == 50
    assert twostep("init", "--preset", "tiny", "--vocab", "60", "--out", out, "--force").returncode == 0
    assert load_checkpoint(out).config.src_vocab_size == 60


def test_links_files_and_file_parents_are_refused(tmp_path, tiny_ckpt):
    target = tmp_path / "elsewhere"
    before = user_files(target)
    (tmp_path / "link").symlink_to(target)
    assert_user_error(twostep("export", tiny_ckpt, "--out", tmp_path / "link", "--force"), "is a symbolic link")
    (tmp_path / "file").write_text("x")
    assert_user_error(twostep("export", tiny_ckpt, "--out", tmp_path / "file"), "is not a directory")
    assert_user_error(twostep("init", "--preset", "tiny", "--vocab", "50", "--out", tmp_path / "file" / "ck"),
                      "is a file, not a directory")
    assert snapshot(target) == before and (tmp_path / "file").read_text() == "x"


def without_write_permission() -> list[str]:
    """A command prefix under which permission bits hold, also for root (capabilities dropped)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): permission bits cannot be enforced")
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]


def test_an_unwritable_parent_is_one_line(tmp_path, tiny_ckpt):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        for args in (("export", tiny_ckpt, "--out", locked / "art"),
                     ("init", "--preset", "tiny", "--vocab", "50", "--out", locked / "deep" / "ck")):
            result = subprocess.run([*without_write_permission(), sys.executable, "-m", "twostep.cli", *map(str, args)],
                                    capture_output=True, text=True, timeout=300)
            assert_user_error(result, f"cannot write {locked}", "Permission denied")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def limit_file_size():  # in the child: writes past 1 MB fail with EFBIG, as on a full disk
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


@pytest.mark.parametrize("command", ["export", "init"])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, demo_model_dir, command):
    out = tmp_path / "new" / "deeper" / "out"
    args = {"export": ("export", demo_model_dir, "--out", out),
            "init": ("init", "--preset", "tiny", "--vocab", "30000", "--out", out)}[command]
    result = subprocess.run([sys.executable, "-m", "twostep.cli", *map(str, args)], preexec_fn=limit_file_size,
                            capture_output=True, text=True, timeout=300)
    assert_user_error(result, f"cannot write {out}", "File too large")
    assert list(tmp_path.iterdir()) == []  # no temporary directory, not even the parents it created


def test_train_refuses_user_files_in_its_state_directory_before_training(tmp_path):
    state = tmp_path / "ck.train"
    before = user_files(state)
    assert_user_error(twostep("train", "--preset", "tiny", "--steps", "1", "--out", tmp_path / "ck"),
                      "holds files twostep did not write", "notes.txt")
    assert snapshot(state) == before and not (tmp_path / "ck").exists()


def test_train_keeps_an_interrupted_run_unless_told(tmp_path):
    state = tmp_path / "ck.train"
    state.mkdir()
    (state / "state.json").write_text("{}")
    assert_user_error(twostep("train", "--preset", "tiny", "--steps", "1", "--out", tmp_path / "ck"),
                      "--resume", "--force")
    assert (state / "state.json").read_text() == "{}"


def test_an_output_is_published_readable_by_others_whatever_the_umask(tmp_path, tiny_ckpt):
    """A temporary directory is made private (mkdtemp: 0o700); the published one is 0o755, as `mkdir` would make
    it, so that a server running as another user can read the artifact."""
    out = tmp_path / "art"
    old = os.umask(0o077)
    try:
        twostep("init", "--preset", "tiny", "--vocab", "50", "--out", out)
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o755


@pytest.mark.parametrize("problem", ["not JSON", "not UTF-8", "unreadable"])
def test_a_json_file_that_cannot_be_read_is_named_with_the_reason(tmp_path, problem):
    from twostep.errors import BadArtifact
    from twostep.files import read_json

    file = tmp_path / "manifest.json"
    if problem == "unreadable":
        file.mkdir()  # reading a directory: IsADirectoryError, an OSError
        expected = f"{file}: cannot read it (Is a directory)"
    else:
        file.write_bytes(b'{"schema": 3,' if problem == "not JSON" else b'{"name": "\xff"}')
        expected = f"{file}: not valid JSON ("
    with pytest.raises(BadArtifact) as caught:
        read_json(file, BadArtifact)
    assert str(caught.value).startswith(expected)
    assert ("line 1 column" in str(caught.value)) == (problem == "not JSON")  # the parser's own words, kept


def test_a_file_written_atomically_is_whole_or_untouched(tmp_path, monkeypatch):
    from twostep.files import write_file_atomic

    file = tmp_path / "ledger.json"
    write_file_atomic(file, b"old")
    write_file_atomic(file, b"new contents")
    assert file.read_bytes() == b"new contents"

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        write_file_atomic(file, b"half")
    assert file.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json"]  # no temporary file left


def test_an_os_error_while_writing_is_one_line_naming_the_output_and_the_file():
    from pathlib import Path

    from twostep.errors import OutputError
    from twostep.files import os_errors

    out = Path("/srv/art")
    with pytest.raises(OutputError) as caught, os_errors(out):
        raise PermissionError(13, "Permission denied", "/srv/art/.tmp/encoder.onnx")
    assert str(caught.value) == "cannot write /srv/art: /srv/art/.tmp/encoder.onnx: Permission denied"
    with pytest.raises(OutputError) as caught, os_errors(out):
        raise PermissionError(13, "Permission denied", "/srv/art")  # the output itself: named once
    assert str(caught.value) == "cannot write /srv/art: Permission denied"
    with pytest.raises(OutputError) as caught, os_errors(out):
        raise OSError("no strerror")
    assert str(caught.value) == "cannot write /srv/art: no strerror"


def test_every_file_and_directory_of_an_output_is_synced_before_it_is_renamed_in(tmp_path, monkeypatch):
    """fsync of each file, then of each directory, then the rename: after a power loss the output is whole or
    absent. A spy on os.fsync names what each call synced (through /proc/self/fd)."""
    from twostep.files import OutputKind, output_directory

    kind = OutputKind("thing", "marker.json", lambda path: {p.name for p in path.iterdir()})
    synced, real_fsync, real_rename = [], os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    renamed = []
    monkeypatch.setattr(os, "rename", lambda a, b: (renamed.append((list(synced), str(b))), real_rename(a, b)))
    out = tmp_path / "out"
    with output_directory(out, kind) as tmp:
        (tmp / "marker.json").write_text("{}")
        (tmp / "engines").mkdir()
        (tmp / "engines" / "plan.bin").write_bytes(b"x")
        tmp_name = tmp.name
    synced_before, target = next(r for r in renamed if r[1] == str(out))
    staged = tmp_path / tmp_name
    assert {str(staged / "marker.json"), str(staged / "engines" / "plan.bin"), str(staged),
            str(staged / "engines")} <= set(synced_before)
    assert str(tmp_path) in synced  # the parent, after the rename: the new name is durable


@pytest.mark.parametrize("count", [2, 3, 4])
def test_a_directory_that_is_not_an_output_is_refused_showing_what_it_holds(tmp_path, count):
    from twostep.artifact.store import ARTIFACT
    from twostep.errors import OutputError
    from twostep.files import check_target

    out = tmp_path / "work"
    out.mkdir()
    for i in range(count):
        (out / f"f{i}.txt").write_text("mine")
    shown = ", ".join(f"f{i}.txt" for i in range(min(count, 3))) + (", ..." if count > 3 else "")  # the first 3
    with pytest.raises(OutputError) as caught:
        check_target(out, ARTIFACT, force=True)
    assert f"is not a twostep artifact (it holds {shown}); twostep never replaces" in str(caught.value)


def test_an_output_holding_files_twostep_did_not_write_is_refused_naming_them(tmp_path, tiny_artifact):
    from twostep.artifact.store import ARTIFACT
    from twostep.errors import OutputError
    from twostep.files import check_target

    out = tmp_path / "art"
    shutil.copytree(tiny_artifact[0], out)
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt", "f.txt"):
        (out / name).write_text("mine")
    with pytest.raises(OutputError) as caught:
        check_target(out, ARTIFACT, force=True)
    assert str(caught.value) == (f"{out} is a twostep artifact but also holds files twostep did not write (a.txt, "
                                 "b.txt, c.txt, d.txt, e.txt); move them out first, or choose another --out")
