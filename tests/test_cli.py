"""The CLI as a user runs it: a real process, exit codes, one-line errors without tracebacks."""

from __future__ import annotations

import json

import pytest
import torch

import reference_models as ref
from cli_helpers import assert_user_error, twostep
from twostep.model.checkpoint import load_checkpoint
from twostep.model.tasks import get_task
from twostep.training.evaluate import checkpoint_translator


def test_evaluate_demo_model_reaches_98_percent(demo_model_dir):
    result = twostep("evaluate", demo_model_dir, "--split", "test", "--json")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert scores["sentences"] == len(get_task("numbers-en-de").split("test")) == 1000
    assert scores["exact_match"] >= 98.0
    assert scores["bleu"] > 90.0


def test_translate_arguments_and_stdin_agree_with_the_library(demo_model_dir):
    sentences = ["three hundred and forty-two", "nineteen thousand, eight hundred and seven"]
    expected = checkpoint_translator(load_checkpoint(demo_model_dir)).translate(sentences)
    from_args = twostep("translate", demo_model_dir, *sentences)
    from_stdin = twostep("translate", demo_model_dir, "--json", "--no-split", stdin="\n".join(sentences) + "\n")
    assert from_args.returncode == 0 and from_stdin.returncode == 0, from_args.stderr + from_stdin.stderr
    assert from_args.stdout.splitlines() == expected
    assert [row["translations"][0]["text"] for row in json.loads(from_stdin.stdout)] == expected


DOCUMENT = ("three hundred and forty-two. seven thousand and one.\n\n"
            "  nine hundred and ninety-nine!\n\n\nfive hundred and six.\n")


def test_translate_splits_a_document_on_stdin_and_keeps_its_paragraphs(demo_model_dir):
    sentences = ["three hundred and forty-two.", "seven thousand and one.", "nine hundred and ninety-nine!",
                 "five hundred and six."]
    translator = checkpoint_translator(load_checkpoint(demo_model_dir))
    de = translator.translate(sentences)
    want = f"{de[0]} {de[1]}\n\n  {de[2]}\n\n\n{de[3]}\n"
    from_stdin = twostep("translate", demo_model_dir, stdin=DOCUMENT)
    from_arg = twostep("translate", demo_model_dir, "--json", DOCUMENT, "eleven.")
    whole = twostep("translate", demo_model_dir, "--no-split", DOCUMENT.replace("\n", " "))
    assert from_stdin.returncode == from_arg.returncode == whole.returncode == 0, from_stdin.stderr + from_arg.stderr
    assert from_stdin.stdout == want
    rows = json.loads(from_arg.stdout)
    assert [row["source"] for row in rows] == [DOCUMENT, "eleven."] and rows[0]["translations"][0]["text"] == want
    assert whole.stdout == translator.translate([DOCUMENT.replace("\n", " ")])[0] + "\n"  # one sentence, as before


def test_translate_help_names_the_split_and_its_opposite():
    result = twostep("translate", "--help")
    assert result.returncode == 0, result.stderr
    assert "--split" in result.stdout and "--no-split" in result.stdout and "paragraphs" in result.stdout


def test_init_writes_a_checkpoint(tmp_path):
    result = twostep("init", "--preset", "tiny", "--vocab", "100", "--out", tmp_path / "ck")
    assert result.returncode == 0, result.stderr
    assert load_checkpoint(tmp_path / "ck").config.src_vocab_size == 100


def test_import_through_the_cli(tmp_path):
    torch.save(ref.build_nn_transformer(2, 2, emb_size=32, nhead=4, src_vocab_size=30, tgt_vocab_size=30,
                                        dim_feedforward=64).state_dict(), tmp_path / "tutorial.pt")
    result = twostep("import", tmp_path / "tutorial.pt", "--format", "nn-transformer", "--heads", "4",
                     "--max-positions", "100", "--out", tmp_path / "ck")
    assert result.returncode == 0, result.stderr
    assert load_checkpoint(tmp_path / "ck").config.max_positions == 100


@pytest.mark.parametrize("args,fragments", [
    (("evaluate", "/nonexistent/ckpt"), ("not a checkpoint directory",)),
    (("translate", "/nonexistent/ckpt", "hello"), ("not a checkpoint directory",)),
    (("import", "/nonexistent.pt", "--format", "annotated", "--heads", "4", "--out", "/tmp/x"), ("file not found",)),
    (("init", "--preset", "huge", "--vocab", "100", "--out", "/tmp/twostep-never"), ("unknown preset 'huge'",)),
])
def test_user_errors_exit_1_without_traceback(args, fragments):
    assert_user_error(twostep(*args), *fragments)


@pytest.mark.parametrize("flags,fragment", [
    (("--beam", "4", "--length-penalty", "700"), "length_penalty must be a finite number in [-10, 10], got 700.0"),
    (("--beam", "4", "--length-penalty", "-1e300"), "length_penalty must be a finite number in [-10, 10]"),
    (("--sample", "--temperature", "1e-9"), "temperature must be a finite number in [0.01, 100]"),
    (("--beam", "300"), "beam size must be an integer in [1, 256], got 300"),
])
def test_options_beyond_their_range_are_one_line(demo_artifact, flags, fragment):
    result = twostep("translate", demo_artifact, "three hundred and forty-two", *flags)
    assert_user_error(result, fragment)
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr


def test_import_unknown_format(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "x.pt")
    result = twostep("import", tmp_path / "x.pt", "--format", "fairseq", "--heads", "4", "--out", tmp_path / "o")
    assert_user_error(result, "unknown import format 'fairseq'")
    assert not (tmp_path / "o").exists()


def test_import_names_no_languages_for_a_state_dict(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "x.pt")
    result = twostep("import", tmp_path / "x.pt", "--format", "annotated", "--heads", "4", "--out", tmp_path / "o",
                     "--src-lang", "en")
    assert_user_error(result, "x.pt is a state dict file: --src-lang and --tgt-lang name the languages")
    assert not (tmp_path / "o").exists()


def test_text_commands_need_a_tokenizer(tmp_path):
    assert twostep("init", "--preset", "tiny", "--vocab", "50", "--out", tmp_path / "ck").returncode == 0
    assert_user_error(twostep("translate", tmp_path / "ck", "one"), "this model has no tokenizer")


def test_empty_input_is_a_user_error(demo_model_dir):
    assert_user_error(twostep("translate", demo_model_dir, stdin="\n\n"), "no input")


@pytest.mark.slow
def test_train_runs_end_to_end(tmp_path):
    result = twostep("train", "--out", tmp_path / "ck", "--preset", "tiny", "--steps", "4", "--eval-every", "2",
                     "--max-tokens", "400")
    assert result.returncode == 0, result.stderr
    ckpt = load_checkpoint(tmp_path / "ck")
    training = ckpt.info["training"]
    assert training["steps"] == 4 and training["command"].startswith("twostep train")
    assert ckpt.tokenizer is not None and ckpt.task == "numbers-en-de"
    assert not (tmp_path / "ck.train").exists()  # the resumable state is removed once training finished


def test_help_shows_extras_in_brackets():
    """rich reads [name] as markup: an unescaped 'twostep[ray]' printed as 'twostep'."""
    result = twostep("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert "twostep[ray]" in result.stdout


def test_translate_cli_on_the_artifact_matches_eager(demo_artifact, demo_model_dir):
    sentences = ["three hundred and forty-two", "seventy-one thousand and five"]
    onnx_run = twostep("translate", demo_artifact, *sentences, "--beam", "4")
    eager_run = twostep("translate", demo_model_dir, *sentences, "--beam", "4")
    assert onnx_run.returncode == 0 and eager_run.returncode == 0, onnx_run.stderr + eager_run.stderr
    assert onnx_run.stdout == eager_run.stdout and len(onnx_run.stdout.splitlines()) == 2


def test_inspect_prints_the_io_table(demo_artifact):
    result = twostep("inspect", demo_artifact)
    assert result.returncode == 0, result.stderr
    assert "past_key_self_0" in result.stdout and "past_len + new_len" in result.stdout


def test_unavailable_backend_on_the_cli(demo_artifact):
    assert_user_error(twostep("translate", demo_artifact, "one", "--backend", "ort-cuda"),
                      "backend 'ort-cuda' is not available here")
    assert_user_error(twostep("translate", demo_artifact, "one", "--backend", "nope"), "unknown backend 'nope'")


def test_translate_a_file_as_the_library_translates_its_runs(demo_model_dir, tmp_path):
    docx = pytest.importorskip("docx", reason="python-docx builds the .docx file (pip install -e '.[dev]')")
    document = docx.Document()
    paragraph = document.add_paragraph("three hundred and forty-two ", style="Heading 1")
    paragraph.add_run("seven thousand and one.").bold = True
    document.save(tmp_path / "in.docx")
    result = twostep("translate", demo_model_dir, "--file", tmp_path / "in.docx", "--out", tmp_path / "out.docx")
    assert result.returncode == 0, result.stderr
    out = docx.Document(tmp_path / "out.docx").paragraphs[0]
    want = checkpoint_translator(load_checkpoint(demo_model_dir)).translate(
        ["three hundred and forty-two ", "seven thousand and one."], split=True)
    assert [(r.text, r.bold) for r in out.runs] == [(want[0], None), (want[1], True)]
    assert out.style.name == "Heading 1"
    assert_user_error(twostep("translate", demo_model_dir, "--file", tmp_path / "in.docx"), "--file needs --out")
    (tmp_path / "bad.docx").write_bytes(b"not a zip")
    assert_user_error(twostep("translate", demo_model_dir, "--file", tmp_path / "bad.docx", "--out",
                              tmp_path / "o.docx"), "not a valid .docx file")


def test_translate_with_a_glossary(demo_model_dir, tmp_path):
    """--glossary: a sentence with a term holds its target (a wrong one on purpose, so that it shows); one without
    decodes as without the glossary; --json says which terms each text applied and missed."""
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("seven\tacht\nthousand\ttausend\n")
    plain = twostep("translate", demo_model_dir, "--json", "seven", "nine hundred")
    termed = twostep("translate", demo_model_dir, "--json", "--glossary", glossary, "seven", "nine hundred")
    assert plain.returncode == termed.returncode == 0, termed.stderr
    plain, termed = json.loads(plain.stdout), json.loads(termed.stdout)
    assert termed[1]["translations"][0]["text"] == plain[1]["translations"][0]["text"]
    assert termed[1]["applied_terms"] == termed[1]["unmet_terms"] == []
    assert "acht" not in plain[0]["translations"][0]["text"]
    assert "acht" in termed[0]["translations"][0]["text"]
    assert termed[0]["applied_terms"] == [{"source": "seven", "targets": ["acht"]}]


@pytest.mark.parametrize("content, extra, message", [
    ("hundred\n", (), "--glossary {path}: glossary line 1: a source term, a tab, then its target; got 'hundred'"),
    ("hundred\t\n", (), "--glossary {path}: glossary line 1: the glossary entry 'hundred' has an empty target term"),
    ("x" * 300 + "\tx\n", (), "--glossary {path}: glossary line 1: the glossary term 'xxx"),
    ("hundred\thundert\n", ("--sample",), "a glossary needs beam search or greedy decoding, not sampling"),
    (None, (), "--glossary {path}: cannot read it (No such file or directory)"),
])
def test_a_bad_glossary_is_one_line(demo_model_dir, tmp_path, content, extra, message):
    path = tmp_path / "terms.tsv"
    if content is not None:
        path.write_text(content)
    assert_user_error(twostep("translate", demo_model_dir, "--glossary", path, *extra, "six hundred"),
                      message.format(path=path))
