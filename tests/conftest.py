"""Shared fixtures: one tiny random model, the shipped demo checkpoint, tiny pretrained-family models, and tiny
CTranslate2 models and Argos Translate packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import hf_models
from cpp_helpers import CPP
from shared_fixture import built_once
from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer

DEMO_MODEL = Path(__file__).resolve().parents[1] / "twostep" / "demo" / "model"


@pytest.fixture(scope="session")
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(preset("tiny", 50, 60, dropout=0.0)).eval()


@pytest.fixture()
def tiny_ckpt(tmp_path, tiny_model) -> Path:
    return save_checkpoint(tiny_model, tmp_path / "tiny")


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    if not (DEMO_MODEL / "model.safetensors").is_file():
        pytest.fail(f"the shipped demo model is missing at {DEMO_MODEL}")
    return DEMO_MODEL


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> tuple[Path, Path]:
    """(artifact dir, checkpoint dir) of a tiny random model, exported once per session."""
    from twostep.exporter.export import export

    def build(root):
        torch.manual_seed(0)
        ckpt = save_checkpoint(Transformer(preset("tiny", 50, 60, dropout=0.0)), root / "ckpt")
        export(ckpt, root / "art", variants=[])  # the plain graphs only
        return root / "art", ckpt

    return built_once(tmp_path_factory, "tiny", build)


@pytest.fixture(scope="session")
def demo_artifact(tmp_path_factory, demo_model_dir) -> Path:
    from twostep.exporter.export import export

    return built_once(tmp_path_factory, "demo", lambda root: export(demo_model_dir, root / "art", variants=[]).path)


@pytest.fixture(scope="session")
def demo_inplace(tmp_path_factory, demo_model_dir):
    """The demo model exported as `twostep export` does by default, with the in-place decoder, and with its
    standard form (`--variant decoder_inplace_standard`) besides (ExportResult)."""
    from twostep.exporter.export import export

    return built_once(tmp_path_factory, "demo-inplace",
                      lambda root: export(demo_model_dir, root / "art", also=["decoder_inplace_standard"]))


@pytest.fixture(scope="session")
def demo_external(tmp_path_factory, demo_model_dir, demo_inplace) -> Path:
    """The demo model exported as by default, on the external-data path of a model past 2 GB (every graph's
    weights in one data file). demo_inplace, the same export inline, is made first, outside the patch."""
    from twostep.exporter import shared
    from twostep.exporter.export import export

    def build(root):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shared, "EXTERNAL_DATA_BYTES", 0)
            return export(demo_model_dir, root / "art").path

    return built_once(tmp_path_factory, "demo-external", build)


@pytest.fixture(scope="session")
def base_export(tmp_path_factory):
    """The base preset (random weights, vocab 32000) exported once per session: (ExportResult)."""
    from twostep.exporter.export import export
    from twostep.model.init import init_checkpoint

    def build(root):
        ckpt = init_checkpoint(root / "ckpt", "base", 32000)
        return export(ckpt.path, root / "art", variants=[])  # the plain graphs only

    return built_once(tmp_path_factory, "base", build)


@pytest.fixture(scope="session")
def demo_int8(tmp_path_factory, demo_model_dir) -> Path:
    from twostep.exporter.export import export

    return built_once(tmp_path_factory, "demo-int8", lambda root: export(
        demo_model_dir, root / "art", dtype="int8", also=["decoder_inplace_standard"]).path)


@pytest.fixture(scope="session")
def demo_int4(tmp_path_factory, demo_model_dir) -> Path:
    from twostep.exporter.export import export

    return built_once(tmp_path_factory, "demo-int4",
                      lambda root: export(demo_model_dir, root / "art", dtype="int4").path)


@pytest.fixture(scope="session")
def cpp_build(tmp_path_factory) -> Path:
    """cpp/fetch_deps.sh, then CMake into a fresh build directory; the build log on failure."""
    missing = [tool for tool in ("cmake", "ctest", "make", "g++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"building the C++ embedding needs {', '.join(missing)} (apt-get install cmake g++ make)")
    env = {**os.environ, "PYTHON": sys.executable}

    def build(folder):
        steps = [
            ["bash", str(CPP / "fetch_deps.sh")],
            ["cmake", "-S", str(CPP), "-B", str(folder), "-DCMAKE_BUILD_TYPE=Release"],
            ["cmake", "--build", str(folder), "-j", "2"],
        ]
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                pytest.fail(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n"
                            f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}", pytrace=False)
        return folder

    return built_once(tmp_path_factory, "cpp-build", build)


@dataclass(frozen=True)
class Pretrained:
    """A tiny pretrained-family model (tests/hf_models.py): its transformers directory, the twostep checkpoint
    imported from it, the artifact exported from that (default export: with the in-place decoder), the languages
    its sentences translate with, and transformers' generate() answers for TEST_SENTENCES (tokens, texts):
    greedy, and beam 4 with its best hypotheses' `sequences_scores`."""

    name: str
    hf: Path
    ckpt: Path
    art: Path
    langs: dict
    greedy: tuple[list[list[int]], list[str]]
    beam: tuple[list[list[int]], list[str]]
    other_target: str | None  # a second target language, per row (None: the family has one target)
    beam_scores: list[float]  # transformers' sequences_scores of the beam-4 answers

    @property
    def text_in_cpp(self) -> bool:
        """The C++ library tokenizes text with SentencePiece; a tokenizer.json alone it refuses."""
        return self.name not in JSON_ONLY


PRETRAINED = {  # name: (builder, languages, a second target language forced per row)
    "marian": (lambda out: hf_models.marian_dir(out), {"tgt_lang": "fra"}, None),
    "marian-separate": (lambda out: hf_models.marian_dir(out, separate=True), {}, None),
    "m2m100": (hf_models.m2m100_dir, {"src_lang": "en", "tgt_lang": "fr"}, "de"),
    "nllb": (hf_models.nllb_dir, {"src_lang": "eng_Latn", "tgt_lang": "fra_Latn"}, "deu_Latn"),
    "nllb-json": (lambda out: hf_models.nllb_dir(out, with_spm=False), {"src_lang": "eng_Latn", "tgt_lang": "fra_Latn"},
                  "deu_Latn"),
    "mbart50": (hf_models.mbart50_dir, {"src_lang": "en_XX", "tgt_lang": "fr_XX"}, "de_DE"),
    "t5": (hf_models.t5_dir, {}, None),
    "madlad": (lambda out: hf_models.t5_dir(out, madlad=True), {"tgt_lang": "fr"}, "de"),
}
JSON_ONLY = {"nllb-json"}  # tokenizer.json without the SentencePiece model (as transformers 5 saves it)
NEW_TOKENS = 20
# |twostep's beam score - transformers' sequences_scores| at most: fp32 logits agree to ~1e-5 a step; a forced
# token's log-probability left at log_softmax instead of 0 moves M2M100's scores by ~3e-3
SCORE_ATOL = 1e-4


@pytest.fixture(scope="session", params=list(PRETRAINED))
def pretrained(request, tmp_path_factory) -> Pretrained:
    """Each family built by transformers, imported, exported once per session."""
    pytest.importorskip("transformers", reason="the pretrained-family tests build their models with transformers")
    from twostep.exporter.export import export
    from twostep.model.hf import import_hf_directory

    make, langs, other_target = PRETRAINED[request.param]

    def build(root):
        hf = make(root / "hf")
        import_hf_directory(hf, root / "ckpt")
        export(root / "ckpt", root / "art")
        sentences = hf_models.TEST_SENTENCES
        greedy = hf_models.reference(hf, sentences, NEW_TOKENS, **langs)[:2]
        *beam, beam_scores = hf_models.reference(hf, sentences, NEW_TOKENS, beams=4, **langs)
        return Pretrained(request.param, hf, root / "ckpt", root / "art", langs, greedy, tuple(beam), other_target,
                          beam_scores)

    return built_once(tmp_path_factory, request.param, build)


@dataclass(frozen=True)
class CT2Models:
    """Tiny models built by CTranslate2's own converters (tests/ct2_models.py), once per session."""

    opennmt_py: Path  # the OpenNMT-py checkpoint (model.pt)
    spm: Path  # its SentencePiece model, shared by source and target
    ct2: Path  # the checkpoint through OpenNMTPyConverter, float32
    ct2_int8: Path  # the same, int8 (as argos-train converts)
    marian: Path  # hf_models' Marian through TransformersConverter (source.spm, target.spm beside it)
    marian_hf: Path  # the transformers directory it was converted from
    argos: Path  # ct2_int8 and spm as an .argosmodel package
    argos_dir: Path  # that package extracted, as argostranslate installs it
    build_s: dict  # seconds each took to build


@pytest.fixture(scope="session")
def ct2_models(tmp_path_factory) -> CT2Models:
    pytest.importorskip("ctranslate2", reason="the CTranslate2 fixtures are built by its converters")
    pytest.importorskip("transformers", reason="the Marian CTranslate2 fixture is converted from transformers")
    import ct2_models as build

    def make(root):
        seconds = {}

        def timed(name, make, *args, **kwargs):
            start = time.perf_counter()
            path = make(*args, **kwargs)
            seconds[name] = round(time.perf_counter() - start, 2)
            return path

        ckpt = timed("opennmt_py", build.opennmt_py_checkpoint, root / "opennmt_py")
        ct2 = timed("ct2", build.convert_opennmt_py, ckpt, root / "ct2")
        ct2_int8 = timed("ct2_int8", build.convert_opennmt_py, ckpt, root / "ct2-int8", quantization="int8")
        marian = timed("marian", build.marian_ct2, root / "marian")
        spm_file = ckpt.parent / "sentencepiece.model"
        argos = timed("argos", build.argos_package, ct2_int8, spm_file, root / "argos")
        with zipfile.ZipFile(argos) as archive:  # argostranslate.package.install_from_path
            archive.extractall(root / "argos-installed")
        return CT2Models(ckpt, spm_file, ct2, ct2_int8, marian, root / "marian" / "hf", argos,
                         root / "argos-installed" / argos.stem, seconds)

    return built_once(tmp_path_factory, "ct2", make)



@pytest.fixture(scope="session")
def opus_mt_bpe(tmp_path_factory) -> tuple[Path, Path]:
    """An Argos package of an OPUS-MT model from before SentencePiece (ct2_models.marian_bpe_ct2: Moses, BPE
    codes as bpe.model, ct2-marian-converter's output as model/): the .argosmodel zip and the folder argostranslate
    installs it as, built once."""
    pytest.importorskip("ctranslate2", reason="the package's model is written by CTranslate2's Marian converter")
    pytest.importorskip("transformers", reason="its weights are trained as a transformers MarianMTModel")
    import ct2_models as build

    def make(root):
        ct2, codes = build.marian_bpe_ct2(root / "marian")
        package = build.argos_package(ct2, codes, root / "package", tokenizer="bpe.model")
        with zipfile.ZipFile(package) as archive:
            archive.extractall(root / "installed")
        return package, root / "installed" / package.stem

    return built_once(tmp_path_factory, "opus-mt-bpe", make)


@pytest.fixture(scope="session")
def opus_mt_bpe_artifact(opus_mt_bpe, tmp_path_factory) -> Path:
    """opus_mt_bpe's package (tokenizer kind moses-bpe) imported and exported once."""
    from twostep.exporter.export import export
    from twostep.model.sources import import_model

    def build(root):
        import_model(opus_mt_bpe[0], root / "ckpt")
        export(root / "ckpt", root / "art")
        return root / "art"

    return built_once(tmp_path_factory, "opus-mt-bpe-artifact", build)


@pytest.fixture(scope="session")
def argos_artifact(ct2_models, tmp_path_factory) -> Path:
    """ct2_models' Argos package imported (from the .argosmodel zip) and exported once."""
    from twostep.exporter.export import export
    from twostep.model.sources import import_model

    def build(root):
        import_model(ct2_models.argos, root / "ckpt")
        export(root / "ckpt", root / "art")
        return root / "art"

    return built_once(tmp_path_factory, "argos-artifact", build)

@pytest.fixture(scope="session")
def argos_pairs(ct2_models, argos_artifact, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Artifacts of three Argos pairs, for a server of many models: en -> fr (argos_artifact), and ct2_models'
    int8 model packaged again as de -> en and en -> es (the same weights under other pairs' names: what is tested is
    which model answers), each imported and exported once."""
    import ct2_models as build
    from twostep.exporter.export import export
    from twostep.model.sources import import_model

    def make(root):
        out = {("en", "fr"): argos_artifact}
        for source, target in (("de", "en"), ("en", "es")):
            name = f"{source}_{target}"
            package = build.argos_package(ct2_models.ct2_int8, ct2_models.spm, root / name, source, target)
            import_model(package, root / name / "ckpt")
            export(root / name / "ckpt", root / "artifacts" / name)
            out[source, target] = root / "artifacts" / name
        return out

    return built_once(tmp_path_factory, "argos-pairs", make)


# The tests of mbart50_hub take the session's mBART-50 model: `@ONLY_MBART50` picks it among PRETRAINED (a whole
# PRETRAINED entry for the hub's layout would add about a minute to every run: its own model, export, C++ tests).
ONLY_MBART50 = pytest.mark.parametrize("pretrained", ["mbart50"], indirect=True)


@pytest.fixture(scope="session")
def mbart50_hub(pretrained, tmp_path_factory) -> Pretrained:
    """The session's mBART-50 model in the hub's layout, without tokenizer.json (hf_models.mbart50_hub_layout):
    imported from its sentencepiece.bpe.model, exported with the contract's graphs alone, and transformers'
    generate() answers computed on that directory."""
    from twostep.exporter.export import export
    from twostep.model.hf import import_hf_directory

    def build(root):
        hf = hf_models.mbart50_hub_layout(pretrained.hf, root / "hf")
        import_hf_directory(hf, root / "ckpt")
        export(root / "ckpt", root / "art", variants=[])
        sentences, langs = hf_models.TEST_SENTENCES, pretrained.langs
        greedy = hf_models.reference(hf, sentences, NEW_TOKENS, **langs)[:2]
        *beam, beam_scores = hf_models.reference(hf, sentences, NEW_TOKENS, beams=4, **langs)
        return Pretrained("mbart50-hub", hf, root / "ckpt", root / "art", langs, greedy, tuple(beam),
                          pretrained.other_target, beam_scores)

    return built_once(tmp_path_factory, "mbart50-hub", build)
