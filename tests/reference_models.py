"""Independent reference implementations of four "foreign" encoder-decoder
Transformer families, used by the importer tests (build a foreign model, save
its state_dict, import it into our own model family, compare outputs).

This module deliberately imports nothing from ``twostep``; only torch, numpy
and the standard library.  State_dict key names are exactly those produced by
the original code, because mapping those names is what the importers do.

Families and where they come from:

1. ``build_annotated`` -- the Annotated Transformer as given in seed 003
   (Chinese tutorial after Harvard NLP's "The Annotated Transformer"):
   MultiHeadedAttention with ``linears`` (4 clones), SublayerConnection (pre-norm)
   with ``norm``, Embeddings with ``lut`` (or ``embed``, the tutorial's second
   Embeddings class), PositionEncoding buffer ``pe`` (max_len=60), Generator
   ``proj`` + log_softmax.  ``norm="a2b2"`` swaps in Harvard's own LayerNorm
   (params ``a_2``/``b_2``, unbiased std, eps=1e-6).
2. ``build_jadore`` -- jadore801120/attention-is-all-you-need-pytorch, current
   master (transformer/Models.py, Layers.py, SubLayers.py, Modules.py; seed 000).
3. ``build_mha`` -- seed 002's stack built on ``nn.MultiheadAttention``
   (pre-norm SublayerConnection, final Encoder/Decoder ``norm``, Embeddings
   ``embeddings``, PositionalEncoding ``pe``, Generator ``proj``).
4. ``build_nn_transformer`` -- PyTorch's official tutorial "Language
   Translation with nn.Transformer and torchtext" (Seq2SeqTransformer,
   sequence-first nn.Transformer).

All builders seed torch, apply the family's xavier init and then randomize
every 1-D parameter (norm weights -> 1 + N(0, 0.1), norm/Linear/attention
biases -> N(0, 0.1)), so that importer mistakes on norms and biases cannot hide
behind ones/zeros.  Builders return models in eval() mode.
"""
import copy
import math
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def _randomize_norms_and_biases(model, std=0.1):
    """Give every 1-D parameter (norm weights/biases, a_2/b_2, Linear and
    attention biases) a non-trivial random value."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 1:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("weight", "a_2"):  # only norms have 1-D weights here
                p.copy_(1.0 + std * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))


def _xavier(model):
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)


def clones(module, N):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


# =============================================================================
# 1. Annotated Transformer (seed 003 / Harvard NLP)
# =============================================================================
class LayerNorm(nn.Module):
    """Harvard Annotated Transformer LayerNorm (a_2/b_2, unbiased std)."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


def _make_norm(kind, size):
    return nn.LayerNorm(size) if kind == "torch" else LayerNorm(size)


class Embeddings(nn.Module):
    """Seed 003 Embeddings; attribute name is ``lut`` (first class) or
    ``embed`` (second class); seed 002 names it ``embeddings``."""

    def __init__(self, d_model, vocab, attr="lut"):
        super().__init__()
        self.d_model = d_model
        self.attr = attr
        setattr(self, attr, nn.Embedding(vocab, d_model))

    def forward(self, x):
        return getattr(self, self.attr)(x) * math.sqrt(self.d_model)


class PositionEncoding(nn.Module):
    """Buffer ``pe`` [1, max_len, d]; identical formula in seeds 002 and 003."""

    def __init__(self, d_model, dropout, max_len=60):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        position_value = position * div_term
        pe[:, 0::2] = torch.sin(position_value)
        pe[:, 1::2] = torch.cos(position_value)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, :x.size(1)])


def subsequent_mask(size):
    """[1, size, size] bool, True where attending is allowed."""
    mask = np.triu(np.ones((1, size, size)), k=1).astype("uint8")
    return torch.from_numpy(mask) == 0


def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = F.softmax(scores, dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, head, embedding_dim, dropout=0.1):
        super().__init__()
        assert embedding_dim % head == 0
        self.d_k = embedding_dim // head
        self.head = head
        self.linears = clones(nn.Linear(embedding_dim, embedding_dim), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        batch_size = query.size(0)
        query, key, value = [linear(x).view(batch_size, -1, self.head, self.d_k).transpose(1, 2)
                             for linear, x in zip(self.linears, (query, key, value))]
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(batch_size, -1, self.head * self.d_k)
        return self.linears[-1](x)


class PositionwiseFeedForward(nn.Module):
    """Shared by families 1 and 3 (identical in seeds 002 and 003)."""

    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class SublayerConnection(nn.Module):
    """Pre-norm residual: x + dropout(sublayer(norm(x)))."""

    def __init__(self, size, dropout, norm="torch"):
        super().__init__()
        self.norm = _make_norm(norm, size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout, norm="torch"):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm), 2)
        self.size = size

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    """Shared by families 1 and 3 (identical in seeds 002 and 003)."""

    def __init__(self, layer, N, norm="torch"):
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = _make_norm(norm, layer.size)

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, size, self_attn, src_attn, feed_forward, dropout, norm="torch"):
        super().__init__()
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm), 3)
        self.size = size

    def forward(self, x, memory, source_mask, target_mask):
        m = memory
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, target_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, m, m, source_mask))
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    """Shared by families 1 and 3 (identical in seeds 002 and 003)."""

    def __init__(self, layer, N, norm="torch"):
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = _make_norm(norm, layer.size)

    def forward(self, x, memory, source_mask, target_mask):
        for layer in self.layers:
            x = layer(x, memory, source_mask, target_mask)
        return self.norm(x)


class Generator(nn.Module):
    def __init__(self, d_model, vocab_size):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x):
        return F.log_softmax(self.proj(x), dim=-1)


class TransformerModel(nn.Module):
    """Seed 003's top-level model (Harvard's EncoderDecoder + generator)."""

    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, source, target, source_mask, target_mask):
        memory = self.encoder(self.src_embed(source), source_mask)
        output = self.decoder(self.tgt_embed(target), memory, source_mask, target_mask)
        return self.generator(output)


def build_annotated(src_vocab, tgt_vocab, N=2, d_model=32, d_ff=64, h=4, dropout=0.0,
                    norm="torch", embed_attr="lut", max_len=60, seed=0):
    assert norm in ("torch", "a2b2") and embed_attr in ("lut", "embed")
    torch.manual_seed(seed)
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionEncoding(d_model, dropout, max_len)
    model = TransformerModel(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout, norm), N, norm),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, norm), N, norm),
        nn.Sequential(Embeddings(d_model, src_vocab, embed_attr), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab, embed_attr), c(position)),
        Generator(d_model, tgt_vocab))
    _xavier(model)
    _randomize_norms_and_biases(model)
    return model.eval()


def annotated_logprobs(model, src, tgt, pad=0, mask_tgt_pad=True):
    """[B, T, V] log-probs.  mask_tgt_pad=False gives the seeds' greedy_decode
    masking (subsequent mask only; generated pad ids are not masked)."""
    src_mask = (src != pad).unsqueeze(-2)
    tgt_mask = subsequent_mask(tgt.size(-1)).to(tgt.device)
    if mask_tgt_pad:
        tgt_mask = (tgt != pad).unsqueeze(-2) & tgt_mask
    return model(src, tgt, src_mask, tgt_mask)


# =============================================================================
# 2. jadore801120/attention-is-all-you-need-pytorch (current master)
# =============================================================================
class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature, attn_dropout=0.1):
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q, k, v, mask=None):
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))
        if mask is not None:
            attn = attn.masked_fill(mask == 0, -1e9)
        attn = self.dropout(F.softmax(attn, dim=-1))
        return torch.matmul(attn, v), attn


class MultiHeadAttention(nn.Module):
    """jadore MHA: bias-free projections, post-norm residual inside."""

    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_ks = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_vs = nn.Linear(d_model, n_head * d_v, bias=False)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=False)
        self.attention = ScaledDotProductAttention(temperature=d_k ** 0.5)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

    def forward(self, q, k, v, mask=None):
        d_k, d_v, n_head = self.d_k, self.d_v, self.n_head
        sz_b, len_q, len_k, len_v = q.size(0), q.size(1), k.size(1), v.size(1)
        residual = q
        q = self.w_qs(q).view(sz_b, len_q, n_head, d_k)
        k = self.w_ks(k).view(sz_b, len_k, n_head, d_k)
        v = self.w_vs(v).view(sz_b, len_v, n_head, d_v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if mask is not None:
            mask = mask.unsqueeze(1)  # head axis broadcasting
        q, attn = self.attention(q, k, v, mask=mask)
        q = q.transpose(1, 2).contiguous().view(sz_b, len_q, -1)
        q = self.dropout(self.fc(q))
        q += residual
        q = self.layer_norm(q)
        return q, attn


class JadorePositionwiseFeedForward(nn.Module):
    def __init__(self, d_in, d_hid, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_in, d_hid)
        self.w_2 = nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        residual = x
        x = self.w_2(F.relu(self.w_1(x)))
        x = self.dropout(x)
        x += residual
        return self.layer_norm(x)


class JadoreEncoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, dropout=0.1):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = JadorePositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, enc_input, slf_attn_mask=None):
        enc_output, enc_slf_attn = self.slf_attn(enc_input, enc_input, enc_input, mask=slf_attn_mask)
        return self.pos_ffn(enc_output), enc_slf_attn


class JadoreDecoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, dropout=0.1):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.enc_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = JadorePositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, dec_input, enc_output, slf_attn_mask=None, dec_enc_attn_mask=None):
        dec_output, dec_slf_attn = self.slf_attn(dec_input, dec_input, dec_input, mask=slf_attn_mask)
        dec_output, dec_enc_attn = self.enc_attn(dec_output, enc_output, enc_output, mask=dec_enc_attn_mask)
        return self.pos_ffn(dec_output), dec_slf_attn, dec_enc_attn


def get_pad_mask(seq, pad_idx):
    return (seq != pad_idx).unsqueeze(-2)


def get_subsequent_mask(seq):
    sz_b, len_s = seq.size()
    return (1 - torch.triu(torch.ones((1, len_s, len_s), device=seq.device), diagonal=1)).bool()


class JadorePositionalEncoding(nn.Module):
    def __init__(self, d_hid, n_position=200):
        super().__init__()
        self.register_buffer("pos_table", self._get_sinusoid_encoding_table(n_position, d_hid))

    def _get_sinusoid_encoding_table(self, n_position, d_hid):
        def get_position_angle_vec(position):
            return [position / np.power(10000, 2 * (hid_j // 2) / d_hid) for hid_j in range(d_hid)]

        sinusoid_table = np.array([get_position_angle_vec(pos_i) for pos_i in range(n_position)])
        sinusoid_table[:, 0::2] = np.sin(sinusoid_table[:, 0::2])  # dim 2i
        sinusoid_table[:, 1::2] = np.cos(sinusoid_table[:, 1::2])  # dim 2i+1
        return torch.FloatTensor(sinusoid_table).unsqueeze(0)

    def forward(self, x):
        return x + self.pos_table[:, :x.size(1)].clone().detach()


class JadoreEncoder(nn.Module):
    def __init__(self, n_src_vocab, d_word_vec, n_layers, n_head, d_k, d_v,
                 d_model, d_inner, pad_idx, dropout=0.1, n_position=200, scale_emb=False):
        super().__init__()
        self.src_word_emb = nn.Embedding(n_src_vocab, d_word_vec, padding_idx=pad_idx)
        self.position_enc = JadorePositionalEncoding(d_word_vec, n_position=n_position)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_stack = nn.ModuleList([
            JadoreEncoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout=dropout)
            for _ in range(n_layers)])
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.scale_emb = scale_emb
        self.d_model = d_model

    def forward(self, src_seq, src_mask):
        enc_output = self.src_word_emb(src_seq)
        if self.scale_emb:
            enc_output *= self.d_model ** 0.5
        enc_output = self.dropout(self.position_enc(enc_output))
        enc_output = self.layer_norm(enc_output)  # norm right after emb+pos
        for enc_layer in self.layer_stack:
            enc_output, _ = enc_layer(enc_output, slf_attn_mask=src_mask)
        return enc_output,


class JadoreDecoder(nn.Module):
    def __init__(self, n_trg_vocab, d_word_vec, n_layers, n_head, d_k, d_v,
                 d_model, d_inner, pad_idx, n_position=200, dropout=0.1, scale_emb=False):
        super().__init__()
        self.trg_word_emb = nn.Embedding(n_trg_vocab, d_word_vec, padding_idx=pad_idx)
        self.position_enc = JadorePositionalEncoding(d_word_vec, n_position=n_position)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_stack = nn.ModuleList([
            JadoreDecoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout=dropout)
            for _ in range(n_layers)])
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.scale_emb = scale_emb
        self.d_model = d_model

    def forward(self, trg_seq, trg_mask, enc_output, src_mask):
        dec_output = self.trg_word_emb(trg_seq)
        if self.scale_emb:
            dec_output *= self.d_model ** 0.5
        dec_output = self.dropout(self.position_enc(dec_output))
        dec_output = self.layer_norm(dec_output)
        for dec_layer in self.layer_stack:
            dec_output, _, _ = dec_layer(dec_output, enc_output, slf_attn_mask=trg_mask,
                                         dec_enc_attn_mask=src_mask)
        return dec_output,


class JadoreTransformer(nn.Module):
    """jadore's ``Transformer`` class (renamed here to avoid clashes)."""

    def __init__(self, n_src_vocab, n_trg_vocab, src_pad_idx, trg_pad_idx,
                 d_word_vec=512, d_model=512, d_inner=2048, n_layers=6, n_head=8,
                 d_k=64, d_v=64, dropout=0.1, n_position=200,
                 trg_emb_prj_weight_sharing=True, emb_src_trg_weight_sharing=True,
                 scale_emb_or_prj='prj'):
        super().__init__()
        self.src_pad_idx, self.trg_pad_idx = src_pad_idx, trg_pad_idx
        # 'emb': multiply sqrt(d_model) to embedding output; 'prj': multiply
        # sqrt(d_model)^-1 to the projection output; 'none': nothing.  Both only
        # apply when the target embedding is shared with the projection.
        assert scale_emb_or_prj in ['emb', 'prj', 'none']
        scale_emb = (scale_emb_or_prj == 'emb') if trg_emb_prj_weight_sharing else False
        self.scale_prj = (scale_emb_or_prj == 'prj') if trg_emb_prj_weight_sharing else False
        self.d_model = d_model
        kw = dict(n_position=n_position, d_word_vec=d_word_vec, d_model=d_model, d_inner=d_inner,
                  n_layers=n_layers, n_head=n_head, d_k=d_k, d_v=d_v, dropout=dropout,
                  scale_emb=scale_emb)
        self.encoder = JadoreEncoder(n_src_vocab=n_src_vocab, pad_idx=src_pad_idx, **kw)
        self.decoder = JadoreDecoder(n_trg_vocab=n_trg_vocab, pad_idx=trg_pad_idx, **kw)
        self.trg_word_prj = nn.Linear(d_model, n_trg_vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        assert d_model == d_word_vec
        if trg_emb_prj_weight_sharing:
            self.trg_word_prj.weight = self.decoder.trg_word_emb.weight
        if emb_src_trg_weight_sharing:
            self.encoder.src_word_emb.weight = self.decoder.trg_word_emb.weight

    def forward(self, src_seq, trg_seq):
        src_mask = get_pad_mask(src_seq, self.src_pad_idx)
        trg_mask = get_pad_mask(trg_seq, self.trg_pad_idx) & get_subsequent_mask(trg_seq)
        enc_output, *_ = self.encoder(src_seq, src_mask)
        dec_output, *_ = self.decoder(trg_seq, trg_mask, enc_output, src_mask)
        seq_logit = self.trg_word_prj(dec_output)
        if self.scale_prj:
            seq_logit *= self.d_model ** -0.5
        return seq_logit.view(-1, seq_logit.size(2))


def build_jadore(n_src_vocab, n_trg_vocab, src_pad_idx=0, trg_pad_idx=0, d_model=32, d_inner=64,
                 n_layers=2, n_head=4, d_k=8, d_v=12, dropout=0.0, n_position=200,
                 trg_emb_prj_weight_sharing=True, emb_src_trg_weight_sharing=True,
                 scale_emb_or_prj='prj', seed=0):
    if emb_src_trg_weight_sharing and n_src_vocab != n_trg_vocab:
        raise ValueError("emb_src_trg_weight_sharing requires n_src_vocab == n_trg_vocab")
    torch.manual_seed(seed)
    model = JadoreTransformer(
        n_src_vocab, n_trg_vocab, src_pad_idx, trg_pad_idx, d_word_vec=d_model, d_model=d_model,
        d_inner=d_inner, n_layers=n_layers, n_head=n_head, d_k=d_k, d_v=d_v, dropout=dropout,
        n_position=n_position, trg_emb_prj_weight_sharing=trg_emb_prj_weight_sharing,
        emb_src_trg_weight_sharing=emb_src_trg_weight_sharing, scale_emb_or_prj=scale_emb_or_prj)
    _randomize_norms_and_biases(model)
    return model.eval()


def jadore_logits(model, src, tgt, mask_tgt_pad=True):
    """[B, T, V] logits of Transformer.forward (before its final .view).
    mask_tgt_pad=False uses the Translator's decode masking (subsequent mask
    only) but keeps forward's scale_prj, so the values stay logits."""
    B, T = tgt.shape
    if mask_tgt_pad:
        return model(src, tgt).view(B, T, -1)
    src_mask = get_pad_mask(src, model.src_pad_idx)
    enc_output, *_ = model.encoder(src, src_mask)
    dec_output, *_ = model.decoder(tgt, get_subsequent_mask(tgt), enc_output, src_mask)
    seq_logit = model.trg_word_prj(dec_output)
    return seq_logit * model.d_model ** -0.5 if model.scale_prj else seq_logit


# =============================================================================
# 3. Seed 002: stack built on nn.MultiheadAttention (pre-norm)
# =============================================================================
class MHAEncoderLayer(nn.Module):
    def __init__(self, size, num_heads, feed_forward, dropout):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(size, num_heads, dropout=dropout, batch_first=True)
        self.feed_forward = feed_forward
        self.sublayer = nn.ModuleList([SublayerConnection(size, dropout) for _ in range(2)])
        self.size = size

    def forward(self, x, mask):
        # mask: [B, S] bool key_padding_mask, True = pad
        x = self.sublayer[0](x, lambda x: self.self_attn(
            x, x, x, key_padding_mask=mask, need_weights=False)[0])
        return self.sublayer[1](x, self.feed_forward)


class MHADecoderLayer(nn.Module):
    def __init__(self, size, num_heads, feed_forward, dropout):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(size, num_heads, dropout=dropout, batch_first=True)
        self.src_attn = nn.MultiheadAttention(size, num_heads, dropout=dropout, batch_first=True)
        self.feed_forward = feed_forward
        self.sublayer = nn.ModuleList([SublayerConnection(size, dropout) for _ in range(3)])
        self.size = size

    def forward(self, x, memory, src_mask, tgt_mask):
        # src_mask: [B, S] key_padding_mask (True = pad); tgt_mask: [T, T] bool causal (True = masked)
        x = self.sublayer[0](x, lambda x: self.self_attn(
            x, x, x, attn_mask=tgt_mask, need_weights=False)[0])
        x = self.sublayer[1](x, lambda x: self.src_attn(
            x, memory, memory, key_padding_mask=src_mask, need_weights=False)[0])
        return self.sublayer[2](x, self.feed_forward)


class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


def build_mha(src_vocab, tgt_vocab, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, max_len=5000, seed=0):
    torch.manual_seed(seed)
    c = copy.deepcopy
    ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
    position = PositionEncoding(d_model, dropout, max_len)
    model = EncoderDecoder(
        Encoder(MHAEncoderLayer(d_model, h, c(ff), dropout), N),
        Decoder(MHADecoderLayer(d_model, h, c(ff), dropout), N),
        nn.Sequential(Embeddings(d_model, src_vocab, "embeddings"), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab, "embeddings"), c(position)),
        Generator(d_model, tgt_vocab))
    _xavier(model)
    _randomize_norms_and_biases(model)
    return model.eval()


def mha_logprobs(model, src, tgt, pad=0):
    """[B, T, V] log-probs.  Decoder self-attention gets the causal mask only
    (no target padding mask); with trailing pads this changes pad rows only."""
    src_mask = src == pad  # key_padding_mask, True = pad
    T = tgt.size(1)
    tgt_mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt.device), diagonal=1)
    return model.generator(model(src, tgt, src_mask, tgt_mask))


# =============================================================================
# 4. PyTorch tutorial "Language Translation with nn.Transformer and torchtext"
# =============================================================================
class TutorialPositionalEncoding(nn.Module):
    def __init__(self, emb_size, dropout, maxlen=5000):
        super().__init__()
        den = torch.exp(- torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        pos_embedding = pos_embedding.unsqueeze(-2)  # [maxlen, 1, emb]
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding)

    def forward(self, token_embedding):
        return self.dropout(token_embedding + self.pos_embedding[:token_embedding.size(0), :])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead,
                 src_vocab_size, tgt_vocab_size, dim_feedforward=512, dropout=0.1):
        super().__init__()
        self.transformer = nn.Transformer(d_model=emb_size, nhead=nhead,
                                          num_encoder_layers=num_encoder_layers,
                                          num_decoder_layers=num_decoder_layers,
                                          dim_feedforward=dim_feedforward, dropout=dropout)
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        self.positional_encoding = TutorialPositionalEncoding(emb_size, dropout=dropout)

    def forward(self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask,
                memory_key_padding_mask):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None,
                                src_padding_mask, tgt_padding_mask, memory_key_padding_mask)
        return self.generator(outs)


def generate_square_subsequent_mask(sz, device=None):
    mask = (torch.triu(torch.ones((sz, sz), device=device)) == 1).transpose(0, 1)
    return mask.float().masked_fill(mask == 0, float('-inf')).masked_fill(mask == 1, 0.0)


def create_mask(src, tgt, pad=0):
    """Tutorial's create_mask; src/tgt are sequence-first [S, B] / [T, B]."""
    src_seq_len, tgt_seq_len = src.shape[0], tgt.shape[0]
    tgt_mask = generate_square_subsequent_mask(tgt_seq_len, src.device)
    src_mask = torch.zeros((src_seq_len, src_seq_len), device=src.device).type(torch.bool)
    src_padding_mask = (src == pad).transpose(0, 1)
    tgt_padding_mask = (tgt == pad).transpose(0, 1)
    return src_mask, tgt_mask, src_padding_mask, tgt_padding_mask


def build_nn_transformer(num_encoder_layers=2, num_decoder_layers=2, emb_size=32, nhead=4,
                         src_vocab_size=None, tgt_vocab_size=None, dim_feedforward=64,
                         dropout=0.0, seed=0):
    if src_vocab_size is None or tgt_vocab_size is None:
        raise ValueError("src_vocab_size and tgt_vocab_size are required")
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." (seq-first)
        warnings.simplefilter("ignore", UserWarning)
        model = Seq2SeqTransformer(num_encoder_layers, num_decoder_layers, emb_size, nhead,
                                   src_vocab_size, tgt_vocab_size, dim_feedforward, dropout)
    _xavier(model)
    _randomize_norms_and_biases(model)
    return model.eval()


def nn_transformer_logits(model, src, tgt, pad=0, mask_tgt_pad=True):
    """src [B, S], tgt [B, T] (batch-first int64) -> logits [B, T, V].
    mask_tgt_pad=False drops tgt_padding_mask, as the tutorial's greedy_decode."""
    src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)  # to sequence-first
    src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt, pad)
    if not mask_tgt_pad:
        tgt_padding_mask = None
    with warnings.catch_warnings():  # float attn_mask + bool padding mask deprecation
        warnings.simplefilter("ignore", UserWarning)
        logits = model(src, tgt, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask,
                       src_padding_mask)
    return logits.transpose(0, 1)


# =============================================================================
# 5. No-cache greedy decoding as in the seeds
# =============================================================================
@torch.no_grad()
def reference_greedy(step_fn, src, bos, eos, max_len):
    """step_fn(src, ys) -> [B, T, V] scores over the whole prefix ys [B, T].

    Generates at most ``max_len`` tokens after bos (so ys grows to at most
    max_len + 1 columns).  Returns one token list per sentence, without bos,
    cut before (and excluding) the first eos.  The seeds' greedy loops use
    only a subsequent mask on ys, so build step_fn with mask_tgt_pad=False
    (a random model may emit the pad id).
    """
    B = src.size(0)
    ys = torch.full((B, 1), bos, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        next_word = step_fn(src, ys)[:, -1].argmax(dim=-1)
        ys = torch.cat([ys, next_word.unsqueeze(1).to(ys.dtype)], dim=1)
        done |= next_word == eos
        if bool(done.all()):
            break
    out = []
    for row in ys[:, 1:].tolist():
        out.append(row[:row.index(eos)] if eos in row else row)
    return out


# =============================================================================
# Smoke run
# =============================================================================
if __name__ == "__main__":
    V, PAD, BOS, EOS = 23, 0, 1, 2
    g = torch.Generator().manual_seed(123)

    def padded(lengths, width):
        x = torch.randint(4, V, (len(lengths), width), generator=g)
        for i, n in enumerate(lengths):
            x[i, n:] = PAD
        return x

    src = padded([7, 4, 5], 7)
    tgt = padded([6, 3, 5], 6)
    tgt[:, 0] = BOS
    src_x = torch.cat([src, torch.zeros(3, 3, dtype=torch.long)], dim=1)  # extra src pad
    tgt_x = torch.cat([tgt, torch.zeros(3, 2, dtype=torch.long)], dim=1)  # extra tgt pad
    tgt_nonpad = tgt != PAD

    families = {
        "annotated(torch,lut)": (build_annotated(V, V), annotated_logprobs),
        "annotated(a2b2,embed)": (build_annotated(V, V, norm="a2b2", embed_attr="embed"),
                                  annotated_logprobs),
        "jadore(prj,shared)": (build_jadore(V, V),
                               lambda m, s, t, pad=0, **kw: jadore_logits(m, s, t, **kw)),
        "jadore(emb,unshared)": (build_jadore(V, V + 3, trg_emb_prj_weight_sharing=False,
                                              emb_src_trg_weight_sharing=False,
                                              scale_emb_or_prj="emb"),
                                 lambda m, s, t, pad=0, **kw: jadore_logits(m, s, t, **kw)),
        "mha(seed002)": (build_mha(V, V, max_len=100),  # has no tgt pad mask at all
                         lambda m, s, t, pad=0, **kw: mha_logprobs(m, s, t, pad)),
        "nn.Transformer tutorial": (build_nn_transformer(src_vocab_size=V, tgt_vocab_size=V),
                                    nn_transformer_logits),
    }
    all_ok = True
    for name, (model, fn) in families.items():
        keys = list(model.state_dict().keys())
        print(f"=== {name}: {len(keys)} state_dict keys")
        for k in keys[:15]:
            print("   ", k, tuple(model.state_dict()[k].shape))
        with torch.no_grad():
            out = fn(model, src, tgt, pad=PAD)
            d_src = (fn(model, src_x, tgt, pad=PAD) - out).abs().max().item()
            out_t = fn(model, src, tgt_x, pad=PAD)[:, :tgt.size(1)]
            d_tgt = (out_t - out)[tgt_nonpad].abs().max().item()
            # the tgt-pad-mask flag must not matter on non-pad rows (trailing pads)
            d_flag = (fn(model, src, tgt, pad=PAD, mask_tgt_pad=False) - out)[tgt_nonpad]
            d_flag = d_flag.abs().max().item()
        finite = bool(torch.isfinite(out[tgt_nonpad]).all())
        ok = d_src < 1e-5 and d_tgt < 1e-5 and d_flag < 1e-5 and finite
        all_ok &= ok
        print(f"    out {tuple(out.shape)}  finite={finite}  extra-src-pad diff={d_src:.2e}  "
              f"extra-tgt-pad diff={d_tgt:.2e}  mask_tgt_pad=False diff={d_flag:.2e}  "
              f"-> {'OK' if ok else 'FAIL'}")
        hyp = reference_greedy(lambda s, ys: fn(model, s, ys, pad=PAD, mask_tgt_pad=False),
                               src, BOS, EOS, max_len=8)
        print("    greedy:", hyp)
    print("ALL OK" if all_ok else "SOME CHECKS FAILED")
