"""The encoder-decoder Transformer of "Attention Is All You Need", in one file, top to bottom.

One class family represents every seed model exactly (pre/post norm, LayerNorm flavours, bias-free
projections, separate d_k/d_v, a norm after the embedding, tied embeddings, scaled logits); the config
says which. Two methods map one-to-one onto the two exported graphs:

- `encode(input_ids, attention_mask)` runs the encoder once and returns, for every decoder layer, the
  cross-attention K/V of the source: [(k, v)] with k (B, H, S, Dk), v (B, H, S, Dv).
- `decode_step(input_ids, encoder_attention_mask, past, cross, past_lengths)` takes new target tokens and the
  self-attention KV cache, returns logits and the extended cache. Rows may be at different positions: row r's
  history is the last `past_lengths[r]` columns of the cache (left-padded; the columns before are masked),
  and its new tokens take positions `past_lengths[r]`, `past_lengths[r] + 1`, ... A zero-length cache is the
  first step; a row with `past_lengths[r] = 0` next to longer ones is a sentence that just joined the batch.

Both are written for export: no state stored in forward, no Python branch on a tensor value, and a
mask value taken from the dtype instead of a `-1e9` literal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from twostep.artifact.config import ModelConfig

KV = tuple[Tensor, Tensor]
# (attention module, its input h (B, T, D), the layer's past) -> (attended (B, T, D), the layer's present)
SelfAttention = Callable[[nn.Module, Tensor, KV], tuple[Tensor, KV]]


def sinusoid_table(n_positions: int, d_model: int) -> Tensor:
    """The paper's positional encoding, computed in float64 and stored as float32. (P, D)"""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)[:, : d_model // 2]
    return table.float()


def marian_table(n_positions: int, d_model: int) -> Tensor:
    """Marian's (transformers' MarianSinusoidalPositionalEmbedding): the paper's angles, in float64, with the
    sines in the first half of the vector and the cosines in the second instead of interleaved. (P, D)"""
    j = torch.arange(d_model, dtype=torch.float64)
    angle = torch.arange(n_positions, dtype=torch.float64)[:, None] / torch.pow(10000.0, 2 * (j // 2) / d_model)
    return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1).float()


def fairseq_table(n_positions: int, d_model: int) -> Tensor:
    """fairseq's (M2M100, NLLB: transformers' M2M100SinusoidalPositionalEmbedding.get_embedding), in float32 as
    it computes it: sines then cosines of p * exp(-i log(10000) / (D/2 - 1)). (P, D)"""
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    angle = torch.arange(n_positions, dtype=torch.int64).float()[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    return torch.cat([table, torch.zeros(n_positions, 1)], dim=1) if d_model % 2 else table


def learned_table(n_positions: int, d_model: int) -> Tensor:
    """A learned table (mBART's) before its weights are loaded: zeros. (P, D)"""
    return torch.zeros(n_positions, d_model)


POSITION_TABLES = {"paper": sinusoid_table, "marian": marian_table, "fairseq": fairseq_table, "learned": learned_table}


def no_table(n_positions: int, d_model: int) -> Tensor:
    """No absolute positions (T5): nothing added to the token embeddings. (0, D)"""
    return torch.zeros(0, d_model)


POSITION_TABLES["none"] = no_table


def position_table(config: ModelConfig) -> Tensor:
    """The config's sinusoid, rows offset .. offset + max_positions - 1: position p reads row p. (P, D)"""
    table = POSITION_TABLES[config.positions](config.max_positions + config.position_offset, config.d_model)
    return table[config.position_offset :].contiguous()


def relative_buckets(relative: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative position (key minus query), computed as transformers' T5Attention computes it
    (Mesh TensorFlow's rule): with `bidirectional`, half the buckets for keys after the query; exact buckets for
    distances below half of the rest, logarithmic ones up to max_distance, the last bucket from there on; without,
    keys after the query fall in bucket 0 (the decoder masks them)."""
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out += (relative > 0).to(torch.long) * buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = buckets // 2
    large = max_exact + (torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact)
                         * (buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(relative < max_exact, relative, large)


class RelativeBias(nn.Module):
    """A stack's relative attention bias (config.relative_buckets): a value per bucket and head. The buckets of
    the relative positions -max_distance .. max_distance are computed once, here, in torch (a position further
    away falls in the bucket of max_distance), so that every graph reads them from a table instead of computing a
    logarithm whose last bit could move a bucket's edge."""

    def __init__(self, config: ModelConfig, bidirectional: bool):
        super().__init__()
        self.max_distance = config.relative_max_distance
        self.weight = nn.Parameter(torch.zeros(config.relative_buckets, config.n_heads))  # (buckets, H)
        relative = torch.arange(-self.max_distance, self.max_distance + 1)
        self.register_buffer("buckets", relative_buckets(relative, bidirectional, config.relative_buckets,
                                                         self.max_distance), persistent=False)

    def forward(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        """query_positions (B or 1, T), key_positions (B or 1, K) -> the bias (B or 1, H, T, K)."""
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # (B, T, K)
        distance = self.max_distance
        index = torch.minimum(torch.maximum(relative, torch.full_like(relative, -distance)),
                              torch.full_like(relative, distance)) + distance
        return F.embedding(self.buckets[index], self.weight).permute(0, 3, 1, 2)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class AnnotatedLayerNorm(nn.Module):
    """The original Annotated Transformer's norm: `a_2 * (x - mean) / (std + eps) + b_2`, unbiased std."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.weight * (x - mean) / (std + self.eps) + self.bias


class RMSNorm(nn.Module):
    """T5's norm (transformers' T5LayerNorm): `weight * x / sqrt(mean(x^2) + eps)`, no mean, no bias."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm_type == "annotated":
        return AnnotatedLayerNorm(config.d_model, config.norm_eps)
    if config.norm_type == "rms":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over H heads; K/V are projected separately so they can be cached."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, h = config.d_model, config.n_heads
        self.n_heads, self.d_k, self.d_v = h, config.head_dim_k, config.head_dim_v
        self.q_proj = nn.Linear(d, h * self.d_k, bias=config.attn_bias)
        self.k_proj = nn.Linear(d, h * self.d_k, bias=config.attn_bias)
        self.v_proj = nn.Linear(d, h * self.d_v, bias=config.attn_bias)
        self.out_proj = nn.Linear(h * self.d_v, d, bias=config.attn_bias)
        self.scale = 1.0 / math.sqrt(self.d_k) if config.scale_attention else 1.0
        self.dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: Tensor, head_dim: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> KV:
        return self.split_heads(self.k_proj(x), self.d_k), self.split_heads(self.v_proj(x), self.d_v)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor, bias: Tensor | None = None) -> Tensor:
        """x (B, Tq, D); k (B, H, Tk, Dk); v (B, H, Tk, Dv); mask broadcastable to (B, H, Tq, Tk), True = attend;
        bias (the relative bias) broadcastable to (B, H, Tq, Tk), added to the scores."""
        return self.attend(x, k, v, mask, bias)[0]

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor,
               bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """forward's output and the attention weights (B, H, Tq, Tk)."""
        b, t, _ = x.shape
        q = self.split_heads(self.q_proj(x), self.d_k)  # (B, H, Tq, Dk)
        scores = torch.matmul(q, k.transpose(-2, -1))  # (B, H, Tq, Tk)
        if self.scale != 1.0:
            scores = scores * self.scale
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = F.softmax(scores, dim=-1)
        out = torch.matmul(self.dropout(weights), v)  # (B, H, Tq, Dv)
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.d_v)  # (B, Tq, H*Dv)
        return self.out_proj(out), weights


class FeedForward(nn.Module):
    """w_2(act(w_1 x)), or gated (config.gated_ffn: T5 v1.1's) w_2(act(w_1 x) * w_3 x)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w_1 = nn.Linear(config.d_model, config.d_ff, bias=config.ffn_bias)
        self.w_3 = nn.Linear(config.d_model, config.d_ff, bias=config.ffn_bias) if config.gated_ffn else None
        self.w_2 = nn.Linear(config.d_ff, config.d_model, bias=config.ffn_bias)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = ACTIVATIONS[config.activation]

    def forward(self, x: Tensor) -> Tensor:
        h = self.activation(self.w_1(x))
        if self.w_3 is not None:
            h = h * self.w_3(x)
        return self.w_2(self.dropout(h))


class Sublayers(nn.Module):
    """Residual + norm around each sublayer: pre-norm `x + f(norm(x))`, post-norm `norm(x + f(x))`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.dropout = nn.Dropout(config.dropout)

    def sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.pre_norm else x

    def add(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        x = x + self.dropout(y)
        return x if self.pre_norm else norm(x)


class EncoderLayer(Sublayers):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.self_attn, self.self_attn_norm = MultiHeadAttention(config), make_norm(config)
        self.ffn, self.ffn_norm = FeedForward(config), make_norm(config)

    def forward(self, x: Tensor, mask: Tensor, bias: Tensor | None = None) -> Tensor:
        h = self.sublayer_input(x, self.self_attn_norm)
        k, v = self.self_attn.project_kv(h)
        x = self.add(x, self.self_attn(h, k, v, mask, bias), self.self_attn_norm)
        h = self.sublayer_input(x, self.ffn_norm)
        return self.add(x, self.ffn(h), self.ffn_norm)


class DecoderLayer(Sublayers):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.self_attn, self.self_attn_norm = MultiHeadAttention(config), make_norm(config)
        self.cross_attn, self.cross_attn_norm = MultiHeadAttention(config), make_norm(config)
        self.ffn, self.ffn_norm = FeedForward(config), make_norm(config)

    def forward(self, x: Tensor, self_mask: Tensor, past: KV, cross: KV, cross_mask: Tensor,
                attend: SelfAttention | None = None, aligned_heads: int = 0,
                bias: Tensor | None = None) -> tuple[Tensor, KV, Tensor | None]:
        """`attend` replaces the cached self-attention (an export variant: twostep.exporter.inplace, which then adds
        the relative bias itself). `aligned_heads` > 0: also the cross-attention weights averaged over the first that
        many heads (B, T, S). `bias`: the self-attention's relative bias."""
        h = self.sublayer_input(x, self.self_attn_norm)
        if attend is None:
            k_new, v_new = self.self_attn.project_kv(h)
            k = torch.cat([past[0], k_new], dim=2)  # (B, H, past + new, Dk)
            v = torch.cat([past[1], v_new], dim=2)
            attended, (k, v) = self.self_attn(h, k, v, self_mask, bias), (k, v)
        else:
            attended, (k, v) = attend(self.self_attn, h, past)
        x = self.add(x, attended, self.self_attn_norm)
        h = self.sublayer_input(x, self.cross_attn_norm)
        attended, weights = self.cross_attn.attend(h, cross[0], cross[1], cross_mask)
        x = self.add(x, attended, self.cross_attn_norm)
        h = self.sublayer_input(x, self.ffn_norm)
        alignment = weights[:, :aligned_heads].mean(1) if aligned_heads else None  # (B, T, S)
        return self.add(x, self.ffn(h), self.ffn_norm), (k, v), alignment


class Stack(nn.Module):
    """N layers, with the optional norm after the embedding (jadore, mBART), the optional final norm and the
    optional relative bias of its self-attention (T5's: bidirectional in the encoder)."""

    def __init__(self, config: ModelConfig, layer: type[nn.Module], n_layers: int, final_norm: bool):
        super().__init__()
        self.relative_bias = (RelativeBias(config, bidirectional=layer is EncoderLayer)
                              if config.relative_buckets else None)
        self.embed_norm = make_norm(config) if config.embed_norm else None
        self.layers = nn.ModuleList(layer(config) for _ in range(n_layers))
        self.final_norm = make_norm(config) if final_norm else None


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.src_embed = nn.Embedding(config.src_vocab_size, d)
        self.tgt_embed = self.src_embed if config.share_embeddings else nn.Embedding(config.tgt_vocab_size, d)
        self.register_buffer("pos_table", position_table(config))  # (P, D): the encoder's, and the decoder's
        if config.positions == "learned":  # a table per stack (mBART)
            self.register_buffer("decoder_pos_table", position_table(config))  # (P, D)
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = Stack(config, EncoderLayer, config.n_encoder_layers, config.encoder_final_norm)
        self.decoder = Stack(config, DecoderLayer, config.n_decoder_layers, config.decoder_final_norm)
        self.generator = nn.Linear(d, config.tgt_vocab_size, bias=config.generator_bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot / fan_avg on every matrix, as the seeds do; ties are made after init."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if self.config.tie_generator:
            self.generator.weight = self.tgt_embed.weight

    def embed(self, table: nn.Embedding, pos_table: Tensor, stack: Stack, ids: Tensor, start: Tensor | int,
              zero_first: bool = False) -> Tensor:
        """`start`: the first position, or one per row (B,) where rows are at different positions. `zero_first`:
        position 0 embeds no token, only its position (config.zero_start_embedding)."""
        t = ids.shape[1]
        if isinstance(start, Tensor):
            index = start[:, None] + torch.arange(t, device=ids.device)  # (B, T)
        else:
            index = torch.arange(start, start + t, device=ids.device)  # (T,)
        tokens = table(ids) * self.embed_scale if self.embed_scale != 1.0 else table(ids)  # (B, T, D)
        if zero_first:
            tokens = tokens * (index != 0).to(tokens.dtype)[..., None]
        x = tokens + pos_table[index] if self.config.positions != "none" else tokens  # (B, T, D)
        x = self.embed_dropout(x)
        return stack.embed_norm(x) if stack.embed_norm is not None else x

    def encode(self, input_ids: Tensor, attention_mask: Tensor) -> list[KV]:
        """input_ids, attention_mask (B, S) int64 (1 keep, 0 pad) -> per decoder layer (k, v) of the source."""
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        x = self.embed(self.src_embed, self.pos_table, self.encoder, input_ids, 0)
        bias = None
        if self.encoder.relative_bias is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # (1, S)
            bias = self.encoder.relative_bias(positions, positions)  # (1, H, S, S)
        for layer in self.encoder.layers:
            x = layer(x, mask, bias)
        if self.encoder.final_norm is not None:
            x = self.encoder.final_norm(x)
        return [layer.cross_attn.project_kv(x) for layer in self.decoder.layers]

    def decode_step(
        self, input_ids: Tensor, encoder_attention_mask: Tensor, past: list[KV], cross: list[KV],
        past_lengths: Tensor | None = None, attend: SelfAttention | None = None, alignment: bool = False,
    ) -> tuple[Tensor, list[KV]] | tuple[Tensor, list[KV], Tensor]:
        """input_ids (B, T) new tokens; past[i] (B, H, P, Dh) -> logits (B, T, V), present[i] (B, H, P + T, Dh).
        `past_lengths` (B,): how many of the P cached positions are each row's own, its last ones (None: all P
        for every row). An export variant passes `attend` (the cached self-attention, which then owns the
        cache layout and its masking); past_lengths still sets the positions. `alignment` (a model with
        config.alignment_heads): also return the alignment layer's cross-attention averaged over its first
        alignment_heads heads, (B, T, S)."""
        batch, new_len = input_ids.shape
        past_len, device = past[0][0].shape[2], input_ids.device
        if past_lengths is None:
            past_lengths = torch.full((batch,), past_len, dtype=torch.long, device=device)
        self_mask = bias = None
        if attend is None:  # row r attends to cache columns P - past_lengths[r] .. P - 1, then causally
            key_pos = torch.arange(past_len + new_len, device=device)  # (P + T,)
            query_pos = torch.arange(new_len, device=device) + past_len  # (T,)
            first = past_len - past_lengths  # (B,)
            self_mask = ((key_pos[None, None, :] >= first[:, None, None])
                         & (key_pos[None, None, :] <= query_pos[None, :, None]))[:, None]  # (B, 1, T, P + T)
            if self.decoder.relative_bias is not None:  # column c of row r is its position c - first[r]: the key's
                # position minus the query's is the columns' difference, the same for every row
                bias = self.decoder.relative_bias(query_pos[None], key_pos[None])  # (1, H, T, P + T)
        cross_mask = encoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)

        positions = self.decoder_pos_table if self.config.positions == "learned" else self.pos_table
        x = self.embed(self.tgt_embed, positions, self.decoder, input_ids, past_lengths,
                       self.config.zero_start_embedding)
        present, aligned = [], None
        aligned_layer = self.config.alignment_layer % self.config.n_decoder_layers
        for i, (layer, layer_past, layer_cross) in enumerate(zip(self.decoder.layers, past, cross)):
            heads = self.config.alignment_heads if alignment and i == aligned_layer else 0
            x, kv, weights = layer(x, self_mask, layer_past, layer_cross, cross_mask, attend, heads, bias)
            aligned = weights if weights is not None else aligned
            present.append(kv)
        if self.decoder.final_norm is not None:
            x = self.decoder.final_norm(x)
        logits = self.generator(x)
        if self.config.logit_scale != 1.0:
            logits = logits * self.config.logit_scale
        if alignment:
            if aligned is None:
                raise ValueError("this model has no alignment heads (config.alignment_heads is 0)")
            return logits, present, aligned
        return logits, present

    def empty_cache(self, batch_size: int, dtype: torch.dtype = torch.float32) -> list[KV]:
        c, device = self.config, self.src_embed.weight.device
        k = torch.zeros(batch_size, c.n_heads, 0, c.head_dim_k, dtype=dtype, device=device)
        v = torch.zeros(batch_size, c.n_heads, 0, c.head_dim_v, dtype=dtype, device=device)
        return [(k, v) for _ in range(c.n_decoder_layers)]

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced training: the first decode step with the whole target prefix. (B, T, V)"""
        cross = self.encode(src_ids, src_mask)
        logits, _ = self.decode_step(tgt_in, src_mask, self.empty_cache(src_ids.shape[0]), cross)
        return logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
