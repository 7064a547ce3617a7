"""Tiny CTranslate2 models and Argos Translate packages built here by CTranslate2's own converters, for the parity
tests against `ctranslate2.Translator`; nothing is downloaded.

- `opennmt_py_checkpoint`: an OpenNMT-py v3 checkpoint (the pre-norm Transformer that Argos Translate's models
  are), written without OpenNMT-py: a small module below with OpenNMT-py's parameter names, trained a few steps on
  hf_models' sentences with the target word "chien" taught as <unk> (so that replace_unknowns has work to do).
- `convert_opennmt_py`: `ctranslate2.converters.OpenNMTPyConverter` on it (float32 or int8, as argos-train does).
- `marian_ct2`: hf_models' Marian directory through `ctranslate2.converters.TransformersConverter`.
- `argos_package`: a CTranslate2 directory and a SentencePiece model as an .argosmodel package.
- `ct2_reference`, `argos_reference`: what ctranslate2.Translator gives, plainly and as argostranslate calls it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import zipfile
from pathlib import Path

import sentencepiece as spm

import hf_models

# OpenNMT-py v3's specials, first in its vocabularies in this order (onmt/inputters/inputter.py build_vocab's
# special_tokens: DefaultTokens.UNK, PAD, BOS, EOS); CTranslate2's SequenceToSequenceModelConfig defaults name the same
# unk_token "<unk>", bos_token "<s>", eos_token "</s>", and the converter's decoder_start_token is "<s>".
SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]
UNK, PAD, BOS, EOS = range(4)
D_MODEL, N_HEADS, D_FF, N_LAYERS = 32, 4, 64, 2
MAX_LEN = 5000  # OpenNMT-py's PositionalEncoding table length
SPM_VOCAB = 80
STEPS = 150
SEED = 1  # seed 0 ignores its input more: most sentences come out as one training target
UNK_WORDS = {"chien"}  # target words trained as <unk>: "dog" in a source sentence comes out as <unk>


# ---- the model: OpenNMT-py's pre-norm Transformer, with its parameter names ----------------------------------------

def sinusoids(max_len: int, dim: int):
    """OpenNMT-py v3's PositionalEncoding table (SinusoidalInterleaved): sin on even, cos on odd dimensions,
    kept as (max_len, 1, dim) "for back comp" (onmt/modules/embeddings.py)."""
    import torch

    position = torch.arange(0, max_len).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * -(math.log(10000.0) / dim))
    pe = torch.zeros(max_len, dim)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.unsqueeze(1)  # (max_len, 1, D)


def build_model(vocab_size: int, add_qkvbias: bool):
    """The module, built inside a function so that torch is imported only when a checkpoint is made."""
    import torch
    from torch import nn

    class PositionalEncoding(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", sinusoids(MAX_LEN, D_MODEL))

    class Embeddings(nn.Module):
        """x * sqrt(d_model) + pe: make_embedding.emb_luts.0 and make_embedding.pe, as OpenNMT-py names them."""

        def __init__(self):
            super().__init__()
            self.make_embedding = nn.ModuleDict({
                "emb_luts": nn.ModuleList([nn.Embedding(vocab_size, D_MODEL, padding_idx=PAD)]),
                "pe": PositionalEncoding(),
            })

        def forward(self, ids):  # (B, T) -> (B, T, D)
            emb = self.make_embedding["emb_luts"][0](ids) * math.sqrt(D_MODEL)
            return emb + self.make_embedding["pe"].pe[: ids.shape[1], 0]

    class MultiHeadedAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_keys = nn.Linear(D_MODEL, D_MODEL, bias=add_qkvbias)
            self.linear_values = nn.Linear(D_MODEL, D_MODEL, bias=add_qkvbias)
            self.linear_query = nn.Linear(D_MODEL, D_MODEL, bias=add_qkvbias)
            self.final_linear = nn.Linear(D_MODEL, D_MODEL, bias=add_qkvbias)

        def forward(self, query, memory, mask):  # mask (B, 1 or Tq, Tk), True where attending is allowed
            def heads(x):  # (B, T, D) -> (B, H, T, Dh)
                return x.view(x.shape[0], x.shape[1], N_HEADS, D_MODEL // N_HEADS).transpose(1, 2)

            q = heads(self.linear_query(query)) / math.sqrt(D_MODEL // N_HEADS)
            k, v = heads(self.linear_keys(memory)), heads(self.linear_values(memory))
            scores = (q @ k.transpose(2, 3)).masked_fill(~mask[:, None], float("-inf"))  # (B, H, Tq, Tk)
            out = scores.softmax(-1) @ v  # (B, H, Tq, Dh)
            return self.final_linear(out.transpose(1, 2).reshape(query.shape))  # (B, Tq, D)

    class PositionwiseFeedForward(nn.Module):
        """x + w_2(relu(w_1(layer_norm(x)))): the residual and its norm inside, as in OpenNMT-py."""

        def __init__(self):
            super().__init__()
            self.w_1 = nn.Linear(D_MODEL, D_FF)
            self.w_2 = nn.Linear(D_FF, D_MODEL)
            self.layer_norm = nn.LayerNorm(D_MODEL, eps=1e-6)

        def forward(self, x):
            return x + self.w_2(torch.relu(self.w_1(self.layer_norm(x))))

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = MultiHeadedAttention()
            self.feed_forward = PositionwiseFeedForward()
            self.layer_norm = nn.LayerNorm(D_MODEL, eps=1e-6)

        def forward(self, x, mask):
            h = self.layer_norm(x)
            return self.feed_forward(x + self.self_attn(h, h, mask))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = MultiHeadedAttention()
            self.context_attn = MultiHeadedAttention()
            self.feed_forward = PositionwiseFeedForward()
            self.layer_norm_1 = nn.LayerNorm(D_MODEL, eps=1e-6)
            self.layer_norm_2 = nn.LayerNorm(D_MODEL, eps=1e-6)

        def forward(self, y, memory, self_mask, src_mask):
            h = self.layer_norm_1(y)
            y = y + self.self_attn(h, h, self_mask)
            y = y + self.context_attn(self.layer_norm_2(y), memory, src_mask)
            return self.feed_forward(y)

    class Encoder(nn.Module):
        def __init__(self, embeddings):
            super().__init__()
            self.embeddings = embeddings
            self.transformer = nn.ModuleList([EncoderLayer() for _ in range(N_LAYERS)])
            self.layer_norm = nn.LayerNorm(D_MODEL, eps=1e-6)

        def forward(self, src, src_mask):
            x = self.embeddings(src)
            for layer in self.transformer:
                x = layer(x, src_mask)
            return self.layer_norm(x)

    class Decoder(nn.Module):
        def __init__(self, embeddings):
            super().__init__()
            self.embeddings = embeddings
            self.transformer_layers = nn.ModuleList([DecoderLayer() for _ in range(N_LAYERS)])
            self.layer_norm = nn.LayerNorm(D_MODEL, eps=1e-6)

        def forward(self, tgt, memory, src_mask):
            causal = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).tril()[None]  # (1, T, T)
            y = self.embeddings(tgt)
            for layer in self.transformer_layers:
                y = layer(y, memory, causal, src_mask)
            return self.layer_norm(y)

    class NMTModel(nn.Module):
        """share_embeddings and share_decoder_embeddings, as argos-train's config.yml sets them: one embedding
        for both sides, and the generator's weight is that embedding."""

        def __init__(self):
            super().__init__()
            self.encoder = Encoder(Embeddings())
            self.decoder = Decoder(Embeddings())
            self.decoder.embeddings.make_embedding["emb_luts"][0].weight = \
                self.encoder.embeddings.make_embedding["emb_luts"][0].weight
            self.generator = nn.Linear(D_MODEL, vocab_size)
            self.generator.weight = self.decoder.embeddings.make_embedding["emb_luts"][0].weight

        def forward(self, src, tgt_in):  # (B, S), (B, T) -> logits (B, T, V)
            src_mask = (src != PAD)[:, None]  # (B, 1, S)
            return self.generator(self.decoder(tgt_in, self.encoder(src, src_mask), src_mask))

    return NMTModel()


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


def opt(add_qkvbias: bool) -> argparse.Namespace:
    """The options of an OpenNMT-py v3 Transformer that CTranslate2's converter reads (check_opt and
    _get_model_spec_seq2seq in ctranslate2/converters/opennmt_py.py), and a few more of its usual ones."""
    return argparse.Namespace(
        model_type="text", encoder_type="transformer", decoder_type="transformer", enc_layers=N_LAYERS,
        dec_layers=N_LAYERS, heads=N_HEADS, hidden_size=D_MODEL, word_vec_size=D_MODEL, transformer_ff=D_FF,
        position_encoding=True, max_relative_positions=0, pos_ffn_activation_fn="relu", self_attn_type="scaled-dot",
        feat_merge="concat", lambda_align=0.0, multiquery=False, add_qkvbias=add_qkvbias, add_ffnbias=True,
        layer_norm="standard", norm_eps=1e-6, share_embeddings=True, share_decoder_embeddings=True,
        share_vocab=True, decoder_start_token="<s>", dropout=[0.0], attention_dropout=[0.0],
    )


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
    model = build_model(len(vocab), add_qkvbias)
    with torch.no_grad():  # param_init_glorot, as argos-train trains
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.xavier_uniform_(p)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with one_thread():
        for _ in range(steps):
            optimizer.zero_grad()
            logits = model(src, tgt[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD).backward()
            optimizer.step()
    model.eval()

    state = model.state_dict()  # the tied embedding and generator weights one tensor, as OpenNMT-py saves them
    checkpoint = {
        "model": {k: v for k, v in state.items() if not k.startswith("generator.")},
        "generator": {k.removeprefix("generator."): v for k, v in state.items() if k.startswith("generator.")},
        "vocab": {"src": vocab, "tgt": vocab, "decoder_start_token": "<s>", "data_task": "seq2seq"},
        "opt": opt(add_qkvbias),
        "optim": None,
    }
    path = out / "model.pt"
    torch.save(checkpoint, path)
    return path


def opennmt_py_greedy(ckpt: Path, spm_file: Path, sentences: list[str], max_length: int) -> list[list[str]]:
    """The checkpoint's own greedy decoding, with the module above (OpenNMT-py's, had it been installed): each
    sentence's pieces up to </s> or `max_length` of them."""
    import torch

    checkpoint = torch.load(ckpt, weights_only=False)
    vocab = checkpoint["vocab"]["tgt"]
    model = build_model(len(vocab), checkpoint["opt"].add_qkvbias).eval()
    state = {**checkpoint["model"], **{f"generator.{k}": v for k, v in checkpoint["generator"].items()}}
    model.load_state_dict(state)
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


def convert_opennmt_py(ckpt: Path, out: Path, quantization: str | None = None) -> Path:
    """CTranslate2's OpenNMT-py converter, as ct2-opennmt-py-converter runs it (argos-train passes int8)."""
    from ctranslate2.converters import OpenNMTPyConverter

    return Path(OpenNMTPyConverter(str(ckpt), unsafe_deserialization=True).convert(str(out), quantization=quantization))


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


def argos_package(ct2_dir: Path, spm_file: Path, out: Path, from_code: str = "en", to_code: str = "fr",
                  zipped: bool = True) -> Path:
    """An Argos Translate package as argos-train's train.py makes one: a folder translate-{from}_{to}-1_0 with
    model/ (the CTranslate2 directory), sentencepiece.model, stanza/ (here a placeholder: argostranslate only checks
    that it exists), metadata.json and README.md; zipped, that folder as the one top-level entry of
    `out`/translate-{from}_{to}-1_0.argosmodel (what argostranslate.package.install_from_path extracts)."""
    names = {"en": "English", "fr": "French", "de": "German", "es": "Spanish"}
    name = f"translate-{from_code}_{to_code}-1_0"
    folder = out / name
    shutil.copytree(ct2_dir, folder / "model")
    shutil.copy(spm_file, folder / "sentencepiece.model")
    (folder / "stanza" / from_code / "tokenize").mkdir(parents=True)
    (folder / "stanza" / "resources.json").write_text("{}\n")
    (folder / "stanza" / from_code / "tokenize" / "README").write_text("a placeholder for a Stanza model\n")
    metadata = {"package_version": "1.0", "argos_version": "1.0", "from_code": from_code,
                "from_name": names.get(from_code, from_code), "to_code": to_code,
                "to_name": names.get(to_code, to_code)}
    (folder / "metadata.json").write_text(json.dumps(metadata, indent=4))
    (folder / "README.md").write_text(f"# {metadata['from_name']}-{metadata['to_name']}\n\nA tiny test model.\n")
    if not zipped:
        return folder
    archive = out / f"{name}.argosmodel"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            zf.write(path, path.relative_to(out).as_posix())
    shutil.rmtree(folder)
    return archive


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
