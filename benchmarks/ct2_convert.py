"""Convert a twostep checkpoint into a CTranslate2 model, and check CTranslate2 decodes the same tokens.

    python benchmarks/ct2_convert.py CKPT_DIR OUT_DIR [--check N] [--suppress-eos] [--compute-type int8]

The spec is built with `TransformerSpec.from_config` and every weight is set explicitly from our state dict,
including our own sinusoid table, so CTranslate2 runs exactly our weights. Token strings are synthetic
("<pad>", "<unk>", "<s>", "</s>" at the config's special ids, "t{i}" elsewhere); `ct2_greedy` maps ids to
these strings and back, so both sides speak token ids.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import ctranslate2
import numpy as np
from ctranslate2.specs import TransformerSpec

from twostep.artifact.config import ModelConfig
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime import decoding
from twostep.runtime.backends.torch_backend import TorchSession

SPECIAL = {"pad_id": "<pad>", "unk_id": "<unk>", "bos_id": "<s>", "eos_id": "</s>"}


def unsupported(c: ModelConfig) -> list[str]:
    """Why CTranslate2's TransformerSpec cannot represent this config exactly (empty: it can)."""
    out = []
    if c.norm_type != "torch":
        out.append(f"norm_type {c.norm_type!r} (CTranslate2 only has the standard LayerNorm)")
    if c.logit_scale != 1.0:
        out.append(f"logit_scale {c.logit_scale} (CTranslate2 cannot scale the logits after the generator)")
    if c.head_dim_k != c.d_model // c.n_heads or c.head_dim_v != c.d_model // c.n_heads:
        out.append("d_k/d_v other than d_model // n_heads")
    if c.norm_placement == "pre" and c.encoder_final_norm != c.decoder_final_norm:
        out.append("a final norm in only one of encoder and decoder")
    if c.norm_placement == "post" and (c.encoder_final_norm or c.decoder_final_norm):
        out.append("post-norm with a final norm (CTranslate2 has final norms in pre-norm only)")
    if len({getattr(c, k) for k in SPECIAL}) != len(SPECIAL):
        out.append("pad/unk/bos/eos ids are not distinct")
    return out


def vocabulary(size: int, c: ModelConfig) -> list[str]:
    tokens = [f"t{i}" for i in range(size)]
    for key, name in SPECIAL.items():
        if getattr(c, key) < size:
            tokens[getattr(c, key)] = name
    return tokens


def _linear(spec, w, b=None) -> None:
    spec.weight = w
    if b is not None:
        spec.bias = b


def _norm(spec, sd: dict, name: str) -> None:
    spec.gamma, spec.beta = sd[f"{name}.weight"], sd[f"{name}.bias"]


def _attention(spec, sd: dict, name: str, self_attention: bool) -> None:
    """linear[0] = fused QKV (self) or Q (cross); linear[1] = fused KV (cross); linear[-1] = out_proj."""
    w = {p: sd[f"{name}.{p}_proj.weight"] for p in ("q", "k", "v", "out")}
    b = {p: sd.get(f"{name}.{p}_proj.bias") for p in ("q", "k", "v", "out")}
    has_bias = b["q"] is not None
    if self_attention:
        _linear(spec.linear[0], np.concatenate([w["q"], w["k"], w["v"]]),
                np.concatenate([b["q"], b["k"], b["v"]]) if has_bias else None)
    else:
        _linear(spec.linear[0], w["q"], b["q"])
        _linear(spec.linear[1], np.concatenate([w["k"], w["v"]]),
                np.concatenate([b["k"], b["v"]]) if has_bias else None)
    _linear(spec.linear[-1], w["out"], b["out"])


def _ffn(spec, sd: dict, name: str) -> None:
    _linear(spec.linear_0, sd[f"{name}.ffn.w_1.weight"], sd[f"{name}.ffn.w_1.bias"])
    _linear(spec.linear_1, sd[f"{name}.ffn.w_2.weight"], sd[f"{name}.ffn.w_2.bias"])
    _norm(spec.layer_norm, sd, f"{name}.ffn_norm")


def _stack_inputs(spec, sd: dict, c: ModelConfig, embed: str, stack: str) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = sd[f"{embed}.weight"]
    spec.scale_embeddings = c.scale_embedding  # CTranslate2 multiplies by sqrt(d_model), as we do
    spec.position_encodings.encodings = sd["pos_table"]  # our exact (P, D) float32 table
    if c.embed_norm:
        _norm(spec.layernorm_embedding, sd, f"{stack}.embed_norm")
    if hasattr(spec, "layer_norm"):  # the final norm (pre-norm only)
        _norm(spec.layer_norm, sd, f"{stack}.final_norm")


def convert(ckpt_dir, out_dir, quantization: str | None = None, overwrite: bool = False) -> Path:
    """Write a CTranslate2 model directory for the checkpoint; `quantization` as in ct2's converters."""
    ckpt = load_checkpoint(Path(ckpt_dir))
    c = ckpt.config
    problems = unsupported(c)
    if problems:
        raise ValueError("CTranslate2 cannot represent this checkpoint exactly: " + "; ".join(problems))
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (overwrite and (out_dir / "model.bin").is_file()):
            raise FileExistsError(f"{out_dir} is not empty; overwrite=True (--overwrite) replaces a ct2 model")
        shutil.rmtree(out_dir)
    sd = {k: v.detach().cpu().float().numpy() for k, v in ckpt.model.state_dict().items()}

    pre = c.norm_placement == "pre"
    spec = TransformerSpec.from_config(
        (c.n_encoder_layers, c.n_decoder_layers), c.n_heads, pre_norm=pre,
        no_final_norm=pre and not c.encoder_final_norm, layernorm_embedding=c.embed_norm,
    )
    _stack_inputs(spec.encoder, sd, c, "src_embed", "encoder")
    for i, layer in enumerate(spec.encoder.layer):
        name = f"encoder.layers.{i}"
        _attention(layer.self_attention, sd, f"{name}.self_attn", self_attention=True)
        _norm(layer.self_attention.layer_norm, sd, f"{name}.self_attn_norm")
        _ffn(layer.ffn, sd, name)
    _stack_inputs(spec.decoder, sd, c, "tgt_embed", "decoder")
    for i, layer in enumerate(spec.decoder.layer):
        name = f"decoder.layers.{i}"
        _attention(layer.self_attention, sd, f"{name}.self_attn", self_attention=True)
        _norm(layer.self_attention.layer_norm, sd, f"{name}.self_attn_norm")
        _attention(layer.attention, sd, f"{name}.cross_attn", self_attention=False)
        _norm(layer.attention.layer_norm, sd, f"{name}.cross_attn_norm")
        _ffn(layer.ffn, sd, name)
    _linear(spec.decoder.projection, sd["generator.weight"], sd.get("generator.bias"))

    spec.config.layer_norm_epsilon = c.norm_eps
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<s>", "</s>"
    spec.config.decoder_start_token = "<s>"  # greedy starts from bos, like twostep
    spec.register_source_vocabulary(vocabulary(c.src_vocab_size, c))
    spec.register_target_vocabulary(vocabulary(c.tgt_vocab_size, c))
    spec.validate()
    spec.optimize(quantization=quantization)  # aliases tied tensors, then quantizes
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    return out_dir


def ct2_greedy(model_dir, sources, max_new_tokens: int, compute_type: str = "float32", threads: int = 2,
               suppress_eos: bool = False, translator: ctranslate2.Translator | None = None,
               beam_size: int = 1) -> list[list[int]]:
    """Greedy (or beam, best hypothesis) decoding with CTranslate2; sources are id lists (ending with eos),
    results ids without bos/eos."""
    if translator is None:
        translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                            intra_threads=threads)
    names = _load_vocab(model_dir, "source")
    ids = {t: i for i, t in enumerate(_load_vocab(model_dir, "target"))}
    results = translator.translate_batch(
        [[names[i] for i in s] for s in sources], beam_size=beam_size, max_input_length=0, length_penalty=1.0,
        max_decoding_length=max_new_tokens,
        # min length == max length disables the end token at every step: twostep's suppress_eos
        min_decoding_length=max_new_tokens if suppress_eos else 1,
    )
    return [[ids[t] for t in r.hypotheses[0]] for r in results]


def _load_vocab(model_dir, side: str) -> list[str]:
    model_dir = Path(model_dir)
    path = model_dir / f"{side}_vocabulary.json"
    return json.loads((path if path.is_file() else model_dir / "shared_vocabulary.json").read_text())


def random_sources(vocab: int, eos_id: int, n: int, src_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(1, src_len))] + [eos_id] for _ in range(n)]


def check_same_tokens(ckpt_dir, ct2_dir, n: int = 32, src_len: int = 40, seed: int = 0, max_new_tokens: int = 64,
                      compute_type: str = "float32", suppress_eos: bool = False, threads: int = 2,
                      beam_size: int = 1):
    """Greedy (or beam search's best hypothesis) on n random sentences with twostep eager and CTranslate2;
    returns (identical, total)."""
    import torch

    torch.set_num_threads(threads)
    ckpt = load_checkpoint(Path(ckpt_dir))
    c = ckpt.config
    sources = random_sources(c.src_vocab_size, c.eos_id, n, src_len, seed)
    options = decoding.DecodeOptions(beam_size=beam_size, suppress_eos=suppress_eos)
    ref = [hyps[0].tokens for hyps in decoding.decode(TorchSession(ckpt.model), sources, options,
                                                      specials=decoding.Specials.of(c), max_new_tokens=max_new_tokens)]
    got = ct2_greedy(ct2_dir, sources, max_new_tokens, compute_type, threads, suppress_eos, beam_size=beam_size)
    return sum(a == b for a, b in zip(ref, got)), n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt_dir")
    p.add_argument("out_dir")
    p.add_argument("--quantization", default=None, help="ct2 weight type to store, e.g. int8 (default float32)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing CTranslate2 model in OUT_DIR")
    p.add_argument("--check", type=int, default=0, metavar="N", help="compare greedy tokens on N sentences")
    p.add_argument("--compute-type", default="float32", help="ct2 compute_type for the check")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--src-len", type=int, default=40)
    p.add_argument("--suppress-eos", action="store_true", help="forbid eos: every sentence is max-new-tokens long")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = convert(args.ckpt_dir, args.out_dir, args.quantization, args.overwrite)
    print(f"wrote {out}")
    if args.check:
        same, total = check_same_tokens(args.ckpt_dir, out, args.check, args.src_len, args.seed,
                                        args.max_new_tokens, args.compute_type, args.suppress_eos)
        print(f"identical greedy tokens ({args.compute_type}, suppress_eos={args.suppress_eos}): {same}/{total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
