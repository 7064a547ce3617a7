"""Tiny CTranslate2 models and Argos Translate packages built here by CTranslate2's own converters, for the parity
tests against `ctranslate2.Translator`; nothing is downloaded.

- `opennmt_py_checkpoint`: an OpenNMT-py v3 checkpoint (the pre-norm Transformer that Argos Translate's models
  are), written without OpenNMT-py: benchmarks/opennmt_py.py's module at a tiny size, trained a few steps on
  hf_models' sentences with the target word "chien" taught as <unk> (so that replace_unknowns has work to do).
- `convert_opennmt_py`: `ctranslate2.converters.OpenNMTPyConverter` on it (float32 or int8, as argos-train does).
- `marian_ct2`: hf_models' Marian directory through `ctranslate2.converters.TransformersConverter`.
- `argos_package` (from benchmarks/opennmt_py.py): a CTranslate2 directory and a SentencePiece model as a package.
- `ct2_reference`, `argos_reference`: what ctranslate2.Translator gives, plainly and as argostranslate calls it.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import sentencepiece as spm

import hf_models
from benchmarks.opennmt_py import (  # noqa: F401 (EOS, SPECIALS, convert_opennmt_py, argos_package: the fixtures')
    BOS,
    EOS,
    PAD,
    SPECIALS,
    UNK,
    Size,
    argos_package,
    build_model,
    convert_opennmt_py,
    init_glorot,
    load_checkpoint,
    save_checkpoint,
)

TINY = Size(d_model=32, n_heads=4, d_ff=64, n_layers=2)
SPM_VOCAB = 80
STEPS = 150
SEED = 1  # seed 0 ignores its input more: most sentences come out as one training target
UNK_WORDS = {"chien"}  # target words trained as <unk>: "dog" in a source sentence comes out as <unk>


# ---- the model: OpenNMT-py's pre-norm Transformer (benchmarks/opennmt_py.py), at TINY ------------------------------

@contextlib.contextmanager
def one_thread():
    """Train on one thread: on a shared 2-core machine, torch's two threads waiting on each other made a 3 s build
    take 35 s; and one thread sums in one order, whatever the machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ---- the checkpoint ------------------------------------------------------------------------------------------------

def vocabulary(spm_file: Path) -> list[str]:
    """OpenNMT-py's specials, then the SentencePiece model's pieces but its own <unk>, <s>, </s>."""
    return SPECIALS + [p for p in hf_models.pieces_of(spm_file) if p not in SPECIALS]


def piece_ids(sp: spm.SentencePieceProcessor, index: dict[str, int], text: str, unk_words=frozenset()) -> list[int]:
    ids = []
    for word in text.split():
        ids += [UNK] if word in unk_words else [index.get(p, UNK) for p in sp.encode(word, out_type=str)]
    return ids


def opennmt_py_checkpoint(out: Path, seed: int = SEED, add_qkvbias: bool = False, steps: int = STEPS) -> Path:
    """`out`/model.pt and the SentencePiece model it was trained with, `out`/sentencepiece.model. OpenNMT-py v3's
    default is attention without biases (add_qkvbias False); `add_qkvbias` True gives them to all four linears."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    spm_file = hf_models.train_spm(out / "sentencepiece.model", hf_models.SOURCE_TEXT + hf_models.TARGET_TEXT,
                                   SPM_VOCAB)
    vocab = vocabulary(spm_file)
    index = {p: i for i, p in enumerate(vocab)}
    sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    sources = [piece_ids(sp, index, s) for s in hf_models.SOURCE_TEXT]
    targets = [[BOS, *piece_ids(sp, index, t, UNK_WORDS), EOS] for t in hf_models.TARGET_TEXT]

    def padded(rows):
        return torch.tensor([r + [PAD] * (max(map(len, rows)) - len(r)) for r in rows])

    src, tgt = padded(sources), padded(targets)
    torch.manual_seed(seed)
    model = build_model(len(vocab), TINY, add_qkvbias)
    init_glorot(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with one_thread():
        for _ in range(steps):
            optimizer.zero_grad()
            logits = model(src, tgt[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD).backward()
            optimizer.step()
    model.eval()

    return save_checkpoint(model, vocab, TINY, add_qkvbias, out / "model.pt")


def opennmt_py_greedy(ckpt: Path, spm_file: Path, sentences: list[str], max_length: int) -> list[list[str]]:
    """The checkpoint's own greedy decoding, with the module above (OpenNMT-py's, had it been installed): each
    sentence's pieces up to </s> or `max_length` of them."""
    import torch

    model, vocab = load_checkpoint(ckpt)
    index = {p: i for i, p in enumerate(vocab)}
    sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    answers = []
    for sentence in sentences:
        src = torch.tensor([piece_ids(sp, index, sentence)])
        tgt = [BOS]
        with torch.no_grad():
            while len(tgt) <= max_length and tgt[-1] != EOS:
                tgt.append(int(model(src, torch.tensor([tgt]))[0, -1].argmax()))
        answers.append([vocab[i] for i in tgt[1:] if i != EOS])
    return answers


def marian_ct2(out: Path, seed: int = 0) -> Path:
    """hf_models' Marian model (shared vocabulary, >>fra<</>>deu<< tokens: post-norm, swish, a final_logits_bias)
    through CTranslate2's transformers converter (ct2-transformers-converter), into `out`/ct2, with Marian's
    source.spm and target.spm copied beside its files (the converter copies them itself). Its <pad> row is zeroed
    first, as in the OPUS-MT models that transformers converted: CTranslate2 drops that row and starts the decoder
    from a zero embedding, transformers from the row; zeroed, both agree. `out`/hf is that transformers
    directory."""
    from ctranslate2.converters import TransformersConverter

    with one_thread():
        hf = hf_models.zero_start_embedding(hf_models.marian_dir(out / "hf", seed=seed))
    ct2 = Path(TransformersConverter(str(hf)).convert(str(out / "ct2")))
    for name in ("source.spm", "target.spm"):
        if not (ct2 / name).exists():
            shutil.copy(hf / name, ct2 / name)
    return ct2


# ---- references ----------------------------------------------------------------------------------------------------

def ct2_reference(ct2_dir: Path, spm_file: Path, sentences: list[str], source_prefix: tuple[str, ...] = (),
                  source_suffix: tuple[str, ...] = (), **translate_kwargs) -> tuple[list[list[str]], list[float]]:
    """ctranslate2.Translator in float32 on the SentencePiece pieces of each sentence (between `source_prefix` and
    `source_suffix`: Marian's >>fra<< and </s>): each best hypothesis' pieces and score."""
    import ctranslate2

    sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    source = [[*source_prefix, *sp.encode(s, out_type=str), *source_suffix] for s in sentences]
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    results = translator.translate_batch(source, return_scores=True, **translate_kwargs)
    return [r.hypotheses[0] for r in results], [r.scores[0] for r in results]


def argos_reference(package_dir: Path, sentences: list[str], num_hypotheses: int = 1) -> list[tuple[str, float]]:
    """What argostranslate gives for each sentence (one sentence a text: its sentence splitting left out) with an
    installed package folder: (text, score) of the best hypothesis. Its lines re-created, not imported:
    argostranslate/translate.py apply_packaged_translation (the translate_batch call, the leading-space removal;
    beam_size max(num_hypotheses, settings.beam_size 4), max_batch_size settings.batch_size 32) and
    argostranslate/tokenizer.py SentencePieceTokenizer (encode, decode). Its Translator is made with
    compute_type settings.compute_type, "auto" by default: here float32, so that int8 packages compare too."""
    import ctranslate2

    sp = spm.SentencePieceProcessor(model_file=str(package_dir / "sentencepiece.model"))
    translator = ctranslate2.Translator(str(package_dir / "model"), device="cpu", compute_type="float32")
    answers = []
    for sentence in sentences:
        tokenized = [sp.encode(sentence, out_type=str)]
        result = translator.translate_batch(
            tokenized, target_prefix=None, replace_unknowns=True, max_batch_size=32, batch_type="tokens",
            beam_size=max(num_hypotheses, 4), num_hypotheses=num_hypotheses, length_penalty=0.2, return_scores=True)[0]
        value = sp.decode_pieces(result.hypotheses[0]).replace("▁", " ").replace("_", " ")
        if len(value) > 0 and value[0] == " ":
            value = value[1:]
        answers.append((value, result.scores[0]))
    return answers
