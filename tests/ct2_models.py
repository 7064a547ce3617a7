"""Tiny CTranslate2 models and Argos Translate packages built here by CTranslate2's own converters, for the parity
tests against `ctranslate2.Translator`; nothing is downloaded.

- `opennmt_py_checkpoint`: an OpenNMT-py v3 checkpoint (the pre-norm Transformer that Argos Translate's models
  are), written without OpenNMT-py: benchmarks/opennmt_py.py's module at a tiny size, trained a few steps on
  hf_models' sentences with the target word "chien" taught as <unk> (so that replace_unknowns has work to do).
- `convert_opennmt_py`: `ctranslate2.converters.OpenNMTPyConverter` on it (float32 or int8, as argos-train does).
- `marian_ct2`: hf_models' Marian directory through `ctranslate2.converters.TransformersConverter`.
- `marian_bpe_ct2`: an OPUS-MT model from before SentencePiece (Moses tokens, subword-nmt BPE codes, a Marian
  model.npz and vocab.yml) through `ctranslate2.converters.MarianConverter` (ct2-marian-converter).
- `argos_package` (from benchmarks/opennmt_py.py): a CTranslate2 directory and a SentencePiece model as a package.
- `ct2_reference`, `argos_reference`: what ctranslate2.Translator gives, plainly and as argostranslate calls it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
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


# Sentence pairs with what Moses' rules touch: apostrophes, commas, final marks, French spacing, & and quotes
BPE_SOURCE = ["the cat's hat is on the mat.", "a dog ran in the park, today!", "hello world?",
              "the quick brown fox & the lazy dog.", "we sat in the garden all day.", "good morning, \"friend\"."]
BPE_TARGET = ["le chapeau du chat est sur le tapis.", "un chien court dans le parc, aujourd'hui !",
              "bonjour le monde ?", "le renard brun & le chien paresseux.", "nous sommes dans le jardin.",
              "bonjour, « l'ami »."]
BPE_MERGES = 60


def marian_bpe_ct2(out: Path, seed: int = 0, steps: int = 150) -> tuple[Path, Path]:
    """An OPUS-MT model of the kind released before SentencePiece, converted as ct2-opus-mt-converter converts one
    (MarianConverter on its model.npz and vocab.yml): text Moses-normalized and tokenized (sacremoses, en and fr),
    joint subword-nmt BPE codes learned on it (`out`/bpe.codes), Marian's vocabulary (</s>, <unk>, the pieces), and
    a post-norm swish Transformer (a transformers MarianMTModel trained a few steps on the pieces' ids, its decoder
    starting from a zero row as Marian's does) written under Marian's parameter names with its model.yml. Returns
    the CTranslate2 directory and the codes."""
    import numpy as np
    import torch
    import yaml
    from ctranslate2.converters import MarianConverter
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe
    from transformers import MarianConfig, MarianMTModel

    out.mkdir(parents=True, exist_ok=True)

    def moses(lang: str, lines: list[str]) -> list[str]:
        normalizer, tokenizer = MosesPunctNormalizer(lang), MosesTokenizer(lang)
        return [" ".join(tokenizer.tokenize(normalizer.normalize(line))) for line in lines]

    source, target = moses("en", BPE_SOURCE), moses("fr", BPE_TARGET)
    codes = out / "bpe.codes"
    with codes.open("w", encoding="utf-8") as outfile, contextlib.redirect_stderr(io.StringIO()):  # its progress
        learn_bpe(io.StringIO("\n".join(source + target) + "\n"), outfile, BPE_MERGES)
    with codes.open(encoding="utf-8") as infile:
        bpe = BPE(infile)
    source_pieces = [bpe.segment_tokens(line.split(" ")) for line in source]
    target_pieces = [bpe.segment_tokens(line.split(" ")) for line in target]
    vocab = ["</s>", "<unk>", *sorted({p for line in source_pieces + target_pieces for p in line})]
    index = {p: i for i, p in enumerate(vocab)}
    (out / "vocab.yml").write_text("".join(f"{json.dumps(p, ensure_ascii=False)}: {i}\n"
                                           for i, p in enumerate(vocab)), encoding="utf-8")

    start = len(vocab)  # the decoder's start: a zero row past the vocabulary, left out of model.npz
    config = MarianConfig(vocab_size=start + 1, d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=64, activation_function="swish", scale_embedding=True,
                          pad_token_id=start, eos_token_id=0, decoder_start_token_id=start, dropout=0.0)
    torch.manual_seed(seed)
    model = MarianMTModel(config)

    def padded(rows: list[list[int]], fill: int) -> torch.Tensor:
        return torch.tensor([r + [fill] * (max(map(len, rows)) - len(r)) for r in rows])

    src = padded([[index[p] for p in line] + [0] for line in source_pieces], start)
    labels = padded([[index[p] for p in line] + [0] for line in target_pieces], -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with one_thread():
        for _ in range(steps):
            optimizer.zero_grad()
            model(input_ids=src, attention_mask=src != start, labels=labels).loss.backward()
            optimizer.step()
            with torch.no_grad():
                model.model.shared.weight[start].zero_()
    model.eval()

    weights = {name: p.detach().numpy() for name, p in model.state_dict().items()}

    def row(name: str) -> np.ndarray:
        return weights[name][None, :]

    marian = {"Wemb": weights["model.shared.weight"][:start],
              "decoder_ff_logit_out_b": weights["final_logits_bias"][:, :start]}
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            hf, own = f"model.{side}.layers.{i}", f"{side}_l{i + 1}"
            blocks = {"self": ("self_attn", "self_attn_layer_norm")}
            if side == "decoder":
                blocks["context"] = ("encoder_attn", "encoder_attn_layer_norm")
            for block, (attention, norm) in blocks.items():
                for letter, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
                    marian[f"{own}_{block}_W{letter}"] = weights[f"{hf}.{attention}.{proj}.weight"].T
                    marian[f"{own}_{block}_b{letter}"] = row(f"{hf}.{attention}.{proj}.bias")
                marian[f"{own}_{block}_Wo_ln_scale"] = row(f"{hf}.{norm}.weight")
                marian[f"{own}_{block}_Wo_ln_bias"] = row(f"{hf}.{norm}.bias")
            for n, fc in (("1", "fc1"), ("2", "fc2")):
                marian[f"{own}_ffn_W{n}"] = weights[f"{hf}.{fc}.weight"].T
                marian[f"{own}_ffn_b{n}"] = row(f"{hf}.{fc}.bias")
            marian[f"{own}_ffn_ffn_ln_scale"] = row(f"{hf}.final_layer_norm.weight")
            marian[f"{own}_ffn_ffn_ln_bias"] = row(f"{hf}.final_layer_norm.bias")
    options = {"type": "transformer", "enc-depth": 2, "dec-depth": 2, "transformer-heads": 4,
               "transformer-decoder-autoreg": "self-attention", "transformer-no-projection": False,
               "transformer-ffn-activation": "swish", "transformer-preprocess": "", "transformer-postprocess": "dan",
               "transformer-postprocess-emb": "d", "transformer-guided-alignment-layer": "last"}
    marian["special:model.yml"] = np.frombuffer(yaml.safe_dump(options).encode() + b"\0", dtype=np.int8)
    np.savez(out / "model.npz", **marian)
    ct2 = MarianConverter(str(out / "model.npz"), [str(out / "vocab.yml")] * 2).convert(str(out / "ct2"))
    return Path(ct2), codes


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
    argostranslate/tokenizer.py SentencePieceTokenizer (encode, decode), or BPETokenizer where the package has
    bpe.model and no sentencepiece.model (package.py's order). Its Translator is made with compute_type
    settings.compute_type, "auto" by default: here float32, so that int8 packages compare too."""
    import ctranslate2

    if (package_dir / "sentencepiece.model").is_file():
        sp = spm.SentencePieceProcessor(model_file=str(package_dir / "sentencepiece.model"))
        encode = functools.partial(sp.encode, out_type=str)

        def decode(tokens):
            return sp.decode_pieces(tokens).replace("▁", " ").replace("_", " ")
    else:
        encode, decode = argos_bpe(package_dir)
    translator = ctranslate2.Translator(str(package_dir / "model"), device="cpu", compute_type="float32")
    answers = []
    for sentence in sentences:
        tokenized = [encode(sentence)]
        result = translator.translate_batch(
            tokenized, target_prefix=None, replace_unknowns=True, max_batch_size=32, batch_type="tokens",
            beam_size=max(num_hypotheses, 4), num_hypotheses=num_hypotheses, length_penalty=0.2, return_scores=True)[0]
        value = decode(result.hypotheses[0])
        if len(value) > 0 and value[0] == " ":
            value = value[1:]
        answers.append((value, result.scores[0]))
    return answers


def argos_bpe(package_dir: Path):
    """argostranslate/tokenizer.py BPETokenizer's encode and decode, its lines re-created: sacremoses with the
    package's from_code and to_code, and BPE codes applied by subword-nmt's apply_bpe (argostranslate carries an
    older copy of that file, whose merges come out the same: the lowest-ranked pair first, left to right)."""
    from sacremoses.normalize import MosesPunctNormalizer
    from sacremoses.tokenize import MosesDetokenizer, MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    metadata = json.loads((package_dir / "metadata.json").read_text())
    tokenizer, normalizer = MosesTokenizer(metadata["from_code"]), MosesPunctNormalizer(metadata["from_code"])
    detokenizer = MosesDetokenizer(metadata["to_code"])
    with open(package_dir / "bpe.model", encoding="utf-8") as f:
        bpe_source = BPE(f)

    def encode(sentence: str) -> list[str]:
        tokenized = " ".join(tokenizer.tokenize(normalizer.normalize(sentence)))
        return bpe_source.segment_tokens(tokenized.strip("\r\n ").split(" "))

    def decode(tokens: list[str]) -> str:
        return detokenizer.detokenize(" ".join(tokens).replace("@@ ", "").split(" "))

    return encode, decode
