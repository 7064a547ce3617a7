"""Importers for the checkpoints users already have: a foreign `torch.save` state dict in, a twostep
checkpoint out.

Sizes are inferred from tensor shapes (the head count and special ids, which shapes cannot tell, come
from options); every tensor is mapped, and everything that cannot be mapped is listed in one error. A state
dict saved without its position buffer gets the seeds' sinusoidal table rebuilt, `--max-positions` rows.
Each format's quirks live here, in its own function, and nowhere else.

- `annotated`: the Annotated Transformer (seed 003): `src_embed.0.lut` (or `.embed`), `linears.0-3`,
  `sublayer.K.norm` as `nn.LayerNorm` or `a_2/b_2`, `generator.proj`; max positions from the `pe` buffer.
- `jadore`: jadore801120/attention-is-all-you-need-pytorch (seed 000): post-norm, bias-free projections,
  separate d_k/d_v, a LayerNorm after the embedding, tied embeddings and scaled logits.
- `mha`: a pre-norm stack on `nn.MultiheadAttention` (seed 002): packed `in_proj_weight`.
- `nn-transformer`: PyTorch's translation tutorial, `nn.Transformer` between token embeddings + positional
  encoding and a generator.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from twostep.artifact.config import ModelConfig
from twostep.errors import BadCheckpoint
from twostep.model.checkpoint import (
    Checkpoint,
    assemble,
    canonical_state_dict,
    load_checkpoint,
    parameters_on_meta,
    save_checkpoint,
)
from twostep.model.transformer import Transformer, sinusoid_table

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ImportOptions:
    n_heads: int
    max_positions: int | None = None  # keep only the first N rows of the position table
    scale_emb_or_prj: str = "prj"  # jadore's option of the same name, as the model was trained
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3


class Mapper:
    """Collects (twostep name <- foreign name) pairs, checking each against the model it will load into."""

    def __init__(self, state_dict: StateDict, fmt: str):
        self.sd, self.fmt = state_dict, fmt
        self.used: set[str] = set()
        self.tensors: StateDict = {}
        self.sources: dict[str, str] = {}  # twostep name -> foreign name
        self.problems: list[str] = []

    def shape(self, key: str) -> tuple[int, ...]:
        if key not in self.sd:
            raise BadCheckpoint(f"not a {self.fmt!r} state dict: missing {key} (got keys like "
                                f"{', '.join(list(self.sd)[:4])}); check --format")
        return tuple(self.sd[key].shape)

    def count(self, pattern: str) -> int:
        found = {int(m.group(1)) for k in self.sd if (m := re.match(pattern, k))}
        return max(found) + 1 if found else 0

    def put(self, ours: str, theirs: str, transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.sources[ours] = theirs
        if theirs not in self.sd:
            self.problems.append(f"missing {theirs} (for {ours})")
            return
        self.used.add(theirs)
        tensor = self.sd[theirs]
        self.tensors[ours] = transform(tensor) if transform else tensor

    def linear(self, ours: str, theirs: str, bias: bool = True) -> None:
        self.put(f"{ours}.weight", f"{theirs}.weight")
        if bias:
            self.put(f"{ours}.bias", f"{theirs}.bias")

    def norm(self, ours: str, theirs: str, a2b2: bool = False) -> None:
        self.put(f"{ours}.weight", f"{theirs}.a_2" if a2b2 else f"{theirs}.weight")
        self.put(f"{ours}.bias", f"{theirs}.b_2" if a2b2 else f"{theirs}.bias")

    def packed_attention(self, ours: str, theirs: str, d_model: int) -> None:
        """nn.MultiheadAttention's in_proj_weight (3D, D) holds q, k, v stacked."""
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            rows = slice(i * d_model, (i + 1) * d_model)
            self.put(f"{ours}.{name}.weight", f"{theirs}.in_proj_weight", lambda t, rows=rows: t[rows])
            self.put(f"{ours}.{name}.bias", f"{theirs}.in_proj_bias", lambda t, rows=rows: t[rows])
        self.linear(f"{ours}.out_proj", f"{theirs}.out_proj")

    def position_rows(self, theirs: str, max_positions: int | None) -> int:
        """The model's max_positions: --max-positions, else the rows of the foreign position table."""
        if theirs in self.sd:
            rows = self.sd[theirs].numel() // self.sd[theirs].shape[-1]
            if max_positions and max_positions > rows:
                raise BadCheckpoint(f"--max-positions {max_positions} is more than the {rows} rows of {theirs}")
            return max_positions or rows
        if max_positions:
            return max_positions
        raise BadCheckpoint(f"the state dict has no position table {theirs} (saved without its buffer?); pass "
                            "--max-positions N to rebuild the sinusoidal table that every seed family uses")

    def positions(self, theirs: str, config: ModelConfig) -> torch.Tensor:
        """The foreign position table cut to max_positions rows, or, where the state dict has none, the
        sinusoidal table the seed families compute."""
        if theirs not in self.sd:
            return sinusoid_table(config.max_positions, config.d_model)
        table = self.sd[theirs].reshape(-1, self.sd[theirs].shape[-1])  # (P, D), whatever the batch dims
        self.used.add(theirs)
        return table[: config.max_positions]

    def build(self, config: ModelConfig, positions: torch.Tensor | None) -> Transformer:
        """Check all pairs against a model of `config`; raise one error listing every problem. `positions`: the
        position table, where the mapped tensors do not hold it (learned tables are mapped)."""
        with parameters_on_meta():
            model = Transformer(config)
        if positions is not None:
            self.tensors["pos_table"] = positions
        expected = canonical_state_dict(model)
        problems = list(self.problems)
        problems += [f"unmapped {k} {tuple(self.sd[k].shape)}" for k in self.sd if k not in self.used]
        problems += [f"nothing maps to {k}" for k in expected if k not in self.tensors and k not in self.sources]
        problems += [
            f"{self.sources.get(k, k)} -> {k}: shape {tuple(t.shape)}, expected {tuple(expected[k].shape)}"
            for k, t in self.tensors.items() if k in expected and t.shape != expected[k].shape
        ]
        if problems:
            raise BadCheckpoint(f"cannot import as {self.fmt!r}, {len(problems)} problem(s):\n  "
                                + "\n  ".join(problems))
        return assemble(config, {k: self.tensors[k] for k in expected}, f"the {self.fmt} weights")


def same(sd: StateDict, a: str, b: str) -> bool:
    return a in sd and b in sd and sd[a].shape == sd[b].shape and torch.equal(sd[a], sd[b])


def base_config(opts: ImportOptions, **values) -> ModelConfig:
    return ModelConfig(n_heads=opts.n_heads, pad_id=opts.pad_id, unk_id=opts.unk_id, bos_id=opts.bos_id,
                       eos_id=opts.eos_id, dropout=0.0, **values)


def sublayer_stack(m: Mapper, cfg: ModelConfig, attn: Callable[[str, str], None], a2b2: bool) -> None:
    """The Annotated Transformer's layer layout, shared by `annotated` and `mha`."""
    for i in range(cfg.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"encoder.layers.{i}"
        attn(f"{ours}.self_attn", f"{theirs}.self_attn")
        m.linear(f"{ours}.ffn.w_1", f"{theirs}.feed_forward.w_1")
        m.linear(f"{ours}.ffn.w_2", f"{theirs}.feed_forward.w_2")
        m.norm(f"{ours}.self_attn_norm", f"{theirs}.sublayer.0.norm", a2b2)
        m.norm(f"{ours}.ffn_norm", f"{theirs}.sublayer.1.norm", a2b2)
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"decoder.layers.{i}"
        attn(f"{ours}.self_attn", f"{theirs}.self_attn")
        attn(f"{ours}.cross_attn", f"{theirs}.src_attn")
        m.linear(f"{ours}.ffn.w_1", f"{theirs}.feed_forward.w_1")
        m.linear(f"{ours}.ffn.w_2", f"{theirs}.feed_forward.w_2")
        m.norm(f"{ours}.self_attn_norm", f"{theirs}.sublayer.0.norm", a2b2)
        m.norm(f"{ours}.cross_attn_norm", f"{theirs}.sublayer.1.norm", a2b2)
        m.norm(f"{ours}.ffn_norm", f"{theirs}.sublayer.2.norm", a2b2)
    m.norm("encoder.final_norm", "encoder.norm", a2b2)
    m.norm("decoder.final_norm", "decoder.norm", a2b2)


def embeddings_and_generator(m: Mapper, cfg: ModelConfig, src: str, tgt: str, gen: str) -> None:
    m.put("src_embed.weight", src)
    if cfg.share_embeddings:
        m.used.add(tgt)
    else:
        m.put("tgt_embed.weight", tgt)
    if cfg.tie_generator:
        m.used.add(f"{gen}.weight")
    else:
        m.put("generator.weight", f"{gen}.weight")
    if cfg.generator_bias:
        m.put("generator.bias", f"{gen}.bias")


def import_annotated(sd: StateDict, opts: ImportOptions, fmt: str = "annotated") -> Transformer:
    m = Mapper(sd, fmt)
    attr = "lut" if "src_embed.0.lut.weight" in sd else "embed"
    src, tgt = f"src_embed.0.{attr}.weight", f"tgt_embed.0.{attr}.weight"
    packed = fmt == "mha"
    if packed:
        src, tgt = "src_embed.0.embeddings.weight", "tgt_embed.0.embeddings.weight"
    src_vocab, d = m.shape(src)
    tgt_vocab, _ = m.shape(tgt)
    a2b2 = "encoder.norm.a_2" in sd
    cfg = base_config(
        opts, src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, d_model=d,
        d_ff=m.shape("encoder.layers.0.feed_forward.w_1.weight")[0],
        n_encoder_layers=m.count(r"encoder\.layers\.(\d+)\."), n_decoder_layers=m.count(r"decoder\.layers\.(\d+)\."),
        max_positions=m.position_rows("src_embed.1.pe", opts.max_positions),
        norm_placement="pre", norm_type="annotated" if a2b2 else "torch", norm_eps=1e-6 if a2b2 else 1e-5,
        share_embeddings=same(sd, src, tgt), tie_generator=same(sd, tgt, "generator.proj.weight"),
    )

    def attention(ours: str, theirs: str) -> None:
        if packed:
            m.packed_attention(ours, theirs, d)
            return
        for k, name in enumerate(("q_proj", "k_proj", "v_proj", "out_proj")):
            m.linear(f"{ours}.{name}", f"{theirs}.linears.{k}")

    sublayer_stack(m, cfg, attention, a2b2)
    embeddings_and_generator(m, cfg, src, tgt, "generator.proj")
    m.used.add("tgt_embed.1.pe")  # the same sinusoid table as the source side
    return m.build(cfg, m.positions("src_embed.1.pe", cfg))


def import_mha(sd: StateDict, opts: ImportOptions) -> Transformer:
    return import_annotated(sd, opts, fmt="mha")


def import_jadore(sd: StateDict, opts: ImportOptions) -> Transformer:
    if opts.scale_emb_or_prj not in ("emb", "prj", "none"):
        raise BadCheckpoint(f"--scale-emb-or-prj must be emb, prj or none, got {opts.scale_emb_or_prj!r}")
    m = Mapper(sd, "jadore")
    src, tgt, prj = "encoder.src_word_emb.weight", "decoder.trg_word_emb.weight", "trg_word_prj.weight"
    src_vocab, d = m.shape(src)
    tgt_vocab, _ = m.shape(tgt)
    h = opts.n_heads
    tied = same(sd, tgt, prj)  # jadore scales only when the projection is tied (trg_emb_prj_weight_sharing)
    cfg = base_config(
        opts, src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, d_model=d,
        d_ff=m.shape("encoder.layer_stack.0.pos_ffn.w_1.weight")[0],
        n_encoder_layers=m.count(r"encoder\.layer_stack\.(\d+)\."),
        n_decoder_layers=m.count(r"decoder\.layer_stack\.(\d+)\."),
        max_positions=m.position_rows("encoder.position_enc.pos_table", opts.max_positions),
        d_k=m.shape("encoder.layer_stack.0.slf_attn.w_qs.weight")[0] // h,
        d_v=m.shape("encoder.layer_stack.0.slf_attn.w_vs.weight")[0] // h,
        norm_placement="post", norm_eps=1e-6, attn_bias=False, generator_bias=False, embed_norm=True,
        encoder_final_norm=False, decoder_final_norm=False,
        scale_embedding=tied and opts.scale_emb_or_prj == "emb",
        logit_scale=d**-0.5 if tied and opts.scale_emb_or_prj == "prj" else 1.0,
        share_embeddings=same(sd, src, tgt), tie_generator=tied,
    )

    def attention(ours: str, theirs: str) -> None:
        for name, their_name in (("q_proj", "w_qs"), ("k_proj", "w_ks"), ("v_proj", "w_vs"), ("out_proj", "fc")):
            m.linear(f"{ours}.{name}", f"{theirs}.{their_name}", bias=False)

    for side, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            ours, theirs = f"{side}.layers.{i}", f"{side}.layer_stack.{i}"
            attention(f"{ours}.self_attn", f"{theirs}.slf_attn")
            m.norm(f"{ours}.self_attn_norm", f"{theirs}.slf_attn.layer_norm")
            if side == "decoder":
                attention(f"{ours}.cross_attn", f"{theirs}.enc_attn")
                m.norm(f"{ours}.cross_attn_norm", f"{theirs}.enc_attn.layer_norm")
            m.linear(f"{ours}.ffn.w_1", f"{theirs}.pos_ffn.w_1")
            m.linear(f"{ours}.ffn.w_2", f"{theirs}.pos_ffn.w_2")
            m.norm(f"{ours}.ffn_norm", f"{theirs}.pos_ffn.layer_norm")
        m.norm(f"{side}.embed_norm", f"{side}.layer_norm")
    embeddings_and_generator(m, cfg, src, tgt, "trg_word_prj")
    m.used.add("decoder.position_enc.pos_table")
    return m.build(cfg, m.positions("encoder.position_enc.pos_table", cfg))


def import_nn_transformer(sd: StateDict, opts: ImportOptions) -> Transformer:
    m = Mapper(sd, "nn-transformer")
    src, tgt = "src_tok_emb.embedding.weight", "tgt_tok_emb.embedding.weight"
    src_vocab, d = m.shape(src)
    tgt_vocab, _ = m.shape(tgt)
    cfg = base_config(
        opts, src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, d_model=d,
        d_ff=m.shape("transformer.encoder.layers.0.linear1.weight")[0],
        n_encoder_layers=m.count(r"transformer\.encoder\.layers\.(\d+)\."),
        n_decoder_layers=m.count(r"transformer\.decoder\.layers\.(\d+)\."),
        max_positions=m.position_rows("positional_encoding.pos_embedding", opts.max_positions),
        norm_placement="post", norm_eps=1e-5,
        share_embeddings=same(sd, src, tgt), tie_generator=same(sd, tgt, "generator.weight"),
    )
    for i in range(cfg.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"transformer.encoder.layers.{i}"
        m.packed_attention(f"{ours}.self_attn", f"{theirs}.self_attn", d)
        m.linear(f"{ours}.ffn.w_1", f"{theirs}.linear1")
        m.linear(f"{ours}.ffn.w_2", f"{theirs}.linear2")
        m.norm(f"{ours}.self_attn_norm", f"{theirs}.norm1")
        m.norm(f"{ours}.ffn_norm", f"{theirs}.norm2")
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"transformer.decoder.layers.{i}"
        m.packed_attention(f"{ours}.self_attn", f"{theirs}.self_attn", d)
        m.packed_attention(f"{ours}.cross_attn", f"{theirs}.multihead_attn", d)
        m.linear(f"{ours}.ffn.w_1", f"{theirs}.linear1")
        m.linear(f"{ours}.ffn.w_2", f"{theirs}.linear2")
        m.norm(f"{ours}.self_attn_norm", f"{theirs}.norm1")
        m.norm(f"{ours}.cross_attn_norm", f"{theirs}.norm2")
        m.norm(f"{ours}.ffn_norm", f"{theirs}.norm3")
    m.norm("encoder.final_norm", "transformer.encoder.norm")
    m.norm("decoder.final_norm", "transformer.decoder.norm")
    embeddings_and_generator(m, cfg, src, tgt, "generator")
    return m.build(cfg, m.positions("positional_encoding.pos_embedding", cfg))


IMPORTERS: dict[str, Callable[[StateDict, ImportOptions], Transformer]] = {
    "annotated": import_annotated,
    "jadore": import_jadore,
    "mha": import_mha,
    "nn-transformer": import_nn_transformer,
}


def import_state_dict(sd: StateDict, fmt: str, opts: ImportOptions) -> Transformer:
    if fmt not in IMPORTERS:
        raise BadCheckpoint(f"unknown import format {fmt!r}; choose one of {', '.join(IMPORTERS)}")
    return IMPORTERS[fmt](sd, opts)


def read_state_dict(path: Path) -> StateDict:
    """A foreign torch.save file, loaded without executing code (weights_only=True)."""
    path = Path(path)
    if not path.is_file():
        raise BadCheckpoint(f"{path}: file not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt or unsafe pickles
        raise BadCheckpoint(f"{path}: cannot load with torch.load(weights_only=True): "
                            f"{str(exc).splitlines()[0]}") from None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]  # a training checkpoint that wraps the state dict
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise BadCheckpoint(f"{path}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    return obj


def import_state_dict_file(src: Path, fmt: str, out_dir: Path, opts: ImportOptions,
                           tokenizer: Path | None = None, force: bool = False) -> Checkpoint:
    model = import_state_dict(read_state_dict(src), fmt, opts)
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise BadCheckpoint(f"{tokenizer}: tokenizer file not found")
    info = {"imported_from": {"format": fmt, "file": str(src)}}
    path = save_checkpoint(model, out_dir, tokenizer=tokenizer, info=info, force=force)
    return load_checkpoint(path)
