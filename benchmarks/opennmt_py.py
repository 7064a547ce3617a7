"""OpenNMT-py v3 Transformer checkpoints written without OpenNMT-py, at any size, for CTranslate2's own converter:
the pre-norm Transformer that argos-train trains (and so every Argos Translate model), with OpenNMT-py's parameter
names. tests/ct2_models.py trains a tiny one; benchmarks/argos.py writes one at argos-train's size with random
weights.

- `Size`: the dimensions (argos-train's config.yml: `ARGOS`).
- `build_model`: the module (share_embeddings and share_decoder_embeddings, as argos-train sets them).
- `opt`: the options CTranslate2's converter reads from a checkpoint.
- `save_checkpoint`: the module as OpenNMT-py saves one (model.pt).
- `convert_opennmt_py`: `ctranslate2.converters.OpenNMTPyConverter`, as ct2-opennmt-py-converter runs it.
- `argos_package`: a CTranslate2 directory and a SentencePiece model as an Argos Translate package.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

# OpenNMT-py v3's specials, first in its vocabularies in this order (onmt/inputters/inputter.py build_vocab's
# special_tokens: DefaultTokens.UNK, PAD, BOS, EOS); CTranslate2's SequenceToSequenceModelConfig defaults name the same
# unk_token "<unk>", bos_token "<s>", eos_token "</s>", and the converter's decoder_start_token is "<s>".
SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]
UNK, PAD, BOS, EOS = range(4)
MAX_LEN = 5000  # OpenNMT-py's PositionalEncoding table length


@dataclass(frozen=True)
class Size:
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int  # encoder and decoder alike


ARGOS = Size(d_model=512, n_heads=8, d_ff=2048, n_layers=6)  # argos-train's config.yml (transformer, 6+6 layers)


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


def build_model(vocab_size: int, size: Size, add_qkvbias: bool):
    """The module, built inside a function so that torch is imported only when a checkpoint is made.
    `decode_last(src, tgt_in)`: the generator's logits at the last target position only, (B, V)."""
    import torch
    from torch import nn

    d_model, n_heads = size.d_model, size.n_heads

    class PositionalEncoding(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", sinusoids(MAX_LEN, d_model))

    class Embeddings(nn.Module):
        """x * sqrt(d_model) + pe: make_embedding.emb_luts.0 and make_embedding.pe, as OpenNMT-py names them."""

        def __init__(self):
            super().__init__()
            self.make_embedding = nn.ModuleDict({
                "emb_luts": nn.ModuleList([nn.Embedding(vocab_size, d_model, padding_idx=PAD)]),
                "pe": PositionalEncoding(),
            })

        def forward(self, ids):  # (B, T) -> (B, T, D)
            emb = self.make_embedding["emb_luts"][0](ids) * math.sqrt(d_model)
            return emb + self.make_embedding["pe"].pe[: ids.shape[1], 0]

    class MultiHeadedAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_keys = nn.Linear(d_model, d_model, bias=add_qkvbias)
            self.linear_values = nn.Linear(d_model, d_model, bias=add_qkvbias)
            self.linear_query = nn.Linear(d_model, d_model, bias=add_qkvbias)
            self.final_linear = nn.Linear(d_model, d_model, bias=add_qkvbias)

        def forward(self, query, memory, mask):  # mask (B, 1 or Tq, Tk), True where attending is allowed
            def heads(x):  # (B, T, D) -> (B, H, T, Dh)
                return x.view(x.shape[0], x.shape[1], n_heads, d_model // n_heads).transpose(1, 2)

            q = heads(self.linear_query(query)) / math.sqrt(d_model // n_heads)
            k, v = heads(self.linear_keys(memory)), heads(self.linear_values(memory))
            scores = (q @ k.transpose(2, 3)).masked_fill(~mask[:, None], float("-inf"))  # (B, H, Tq, Tk)
            out = scores.softmax(-1) @ v  # (B, H, Tq, Dh)
            return self.final_linear(out.transpose(1, 2).reshape(query.shape))  # (B, Tq, D)

    class PositionwiseFeedForward(nn.Module):
        """x + w_2(relu(w_1(layer_norm(x)))): the residual and its norm inside, as in OpenNMT-py."""

        def __init__(self):
            super().__init__()
            self.w_1 = nn.Linear(d_model, size.d_ff)
            self.w_2 = nn.Linear(size.d_ff, d_model)
            self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

        def forward(self, x):
            return x + self.w_2(torch.relu(self.w_1(self.layer_norm(x))))

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = MultiHeadedAttention()
            self.feed_forward = PositionwiseFeedForward()
            self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

        def forward(self, x, mask):
            h = self.layer_norm(x)
            return self.feed_forward(x + self.self_attn(h, h, mask))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = MultiHeadedAttention()
            self.context_attn = MultiHeadedAttention()
            self.feed_forward = PositionwiseFeedForward()
            self.layer_norm_1 = nn.LayerNorm(d_model, eps=1e-6)
            self.layer_norm_2 = nn.LayerNorm(d_model, eps=1e-6)

        def forward(self, y, memory, self_mask, src_mask):
            h = self.layer_norm_1(y)
            y = y + self.self_attn(h, h, self_mask)
            y = y + self.context_attn(self.layer_norm_2(y), memory, src_mask)
            return self.feed_forward(y)

    class Encoder(nn.Module):
        def __init__(self, embeddings):
            super().__init__()
            self.embeddings = embeddings
            self.transformer = nn.ModuleList([EncoderLayer() for _ in range(size.n_layers)])
            self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

        def forward(self, src, src_mask):
            x = self.embeddings(src)
            for layer in self.transformer:
                x = layer(x, src_mask)
            return self.layer_norm(x)

    class Decoder(nn.Module):
        def __init__(self, embeddings):
            super().__init__()
            self.embeddings = embeddings
            self.transformer_layers = nn.ModuleList([DecoderLayer() for _ in range(size.n_layers)])
            self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

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
            self.generator = nn.Linear(d_model, vocab_size)
            self.generator.weight = self.decoder.embeddings.make_embedding["emb_luts"][0].weight

        def forward(self, src, tgt_in):  # (B, S), (B, T) -> logits (B, T, V)
            src_mask = (src != PAD)[:, None]  # (B, 1, S)
            return self.generator(self.decoder(tgt_in, self.encoder(src, src_mask), src_mask))

        def decode_last(self, src, tgt_in):  # (B, S), (B, T) -> logits at the last position (B, V)
            src_mask = (src != PAD)[:, None]
            return self.generator(self.decoder(tgt_in, self.encoder(src, src_mask), src_mask)[:, -1])

    return NMTModel()


def init_glorot(model) -> None:
    """param_init_glorot, as argos-train trains: xavier_uniform on every matrix."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.xavier_uniform_(p)


def opt(size: Size, add_qkvbias: bool) -> argparse.Namespace:
    """The options of an OpenNMT-py v3 Transformer that CTranslate2's converter reads (check_opt and
    _get_model_spec_seq2seq in ctranslate2/converters/opennmt_py.py), and a few more of its usual ones."""
    return argparse.Namespace(
        model_type="text", encoder_type="transformer", decoder_type="transformer", enc_layers=size.n_layers,
        dec_layers=size.n_layers, heads=size.n_heads, hidden_size=size.d_model, word_vec_size=size.d_model,
        transformer_ff=size.d_ff, position_encoding=True, max_relative_positions=0, pos_ffn_activation_fn="relu",
        self_attn_type="scaled-dot", feat_merge="concat", lambda_align=0.0, multiquery=False, add_qkvbias=add_qkvbias,
        add_ffnbias=True, layer_norm="standard", norm_eps=1e-6, share_embeddings=True, share_decoder_embeddings=True,
        share_vocab=True, decoder_start_token="<s>", dropout=[0.0], attention_dropout=[0.0],
    )


def save_checkpoint(model, vocab: list[str], size: Size, add_qkvbias: bool, path: Path) -> Path:
    """`path` (model.pt) as OpenNMT-py v3 saves a checkpoint: the tied embedding and generator weights one tensor,
    the generator's parameters apart, the vocabularies, the options."""
    import torch

    state = model.state_dict()
    checkpoint = {
        "model": {k: v for k, v in state.items() if not k.startswith("generator.")},
        "generator": {k.removeprefix("generator."): v for k, v in state.items() if k.startswith("generator.")},
        "vocab": {"src": vocab, "tgt": vocab, "decoder_start_token": "<s>", "data_task": "seq2seq"},
        "opt": opt(size, add_qkvbias),
        "optim": None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path


def load_checkpoint(path: Path):
    """The module and vocabulary of a checkpoint that save_checkpoint wrote."""
    import torch

    checkpoint = torch.load(path, weights_only=False)
    o = checkpoint["opt"]
    vocab = checkpoint["vocab"]["tgt"]
    model = build_model(len(vocab), Size(o.hidden_size, o.heads, o.transformer_ff, o.enc_layers), o.add_qkvbias)
    model.load_state_dict({**checkpoint["model"], **{f"generator.{k}": v for k, v in checkpoint["generator"].items()}})
    return model.eval(), vocab


def convert_opennmt_py(ckpt: Path, out: Path, quantization: str | None = None) -> Path:
    """CTranslate2's OpenNMT-py converter, as ct2-opennmt-py-converter runs it (argos-train passes int8)."""
    from ctranslate2.converters import OpenNMTPyConverter

    return Path(OpenNMTPyConverter(str(ckpt), unsafe_deserialization=True).convert(str(out), quantization=quantization,
                                                                                   force=True))


def argos_package(ct2_dir: Path, spm_file: Path, out: Path, from_code: str = "en", to_code: str = "fr",
                  zipped: bool = True, tokenizer: str = "sentencepiece.model") -> Path:
    """An Argos Translate package as argos-train's train.py makes one: a folder translate-{from}_{to}-1_0 with
    model/ (the CTranslate2 directory), sentencepiece.model (`spm_file`; or, `tokenizer` "bpe.model", the BPE codes
    of an OPUS-MT model from before SentencePiece), stanza/ (here a placeholder: argostranslate only checks that it
    exists), metadata.json and README.md; zipped, that folder as the one top-level entry of
    `out`/translate-{from}_{to}-1_0.argosmodel (what argostranslate.package.install_from_path extracts)."""
    names = {"en": "English", "fr": "French", "de": "German", "es": "Spanish"}
    name = f"translate-{from_code}_{to_code}-1_0"
    folder = out / name
    shutil.copytree(ct2_dir, folder / "model")
    shutil.copy(spm_file, folder / tokenizer)
    (folder / "stanza" / from_code / "tokenize").mkdir(parents=True)
    (folder / "stanza" / "resources.json").write_text("{}\n")
    (folder / "stanza" / from_code / "tokenize" / "README").write_text("a placeholder for a Stanza model\n")
    metadata = {"package_version": "1.0", "argos_version": "1.0", "from_code": from_code,
                "from_name": names.get(from_code, from_code), "to_code": to_code,
                "to_name": names.get(to_code, to_code)}
    (folder / "metadata.json").write_text(json.dumps(metadata, indent=4))
    (folder / "README.md").write_text(f"# {metadata['from_name']}-{metadata['to_name']}\n\nA test model.\n")
    if not zipped:
        return folder
    archive = out / f"{name}.argosmodel"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            zf.write(path, path.relative_to(out).as_posix())
    shutil.rmtree(folder)
    return archive
