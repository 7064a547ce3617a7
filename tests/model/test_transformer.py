"""The model: the KV cache path equals recomputing the full prefix, for every preset and seed family."""

from __future__ import annotations

import pytest
import torch

from twostep.model.config import FAMILIES, PRESETS, ModelConfig, family_config, preset
from twostep.model.transformer import Transformer, sinusoid_table

VOCAB = 40


def variants() -> list[tuple[str, ModelConfig]]:
    out = [(name, preset(name, VOCAB, VOCAB + 3, dropout=0.0)) for name in PRESETS]
    tiny = preset("tiny", VOCAB, VOCAB, dropout=0.0)
    out += [(family, family_config(family, tiny)) for family in FAMILIES]
    out.append(("jadore-dk-dv", family_config("jadore", tiny).replace(d_k=6, d_v=10, logit_scale=32**-0.5)))
    return out


def padded_batch(batch: int = 3, src_len: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (batch, src_len), generator=g)
    mask = torch.ones(batch, src_len, dtype=torch.long)
    mask[1, 6:] = 0  # padding
    mask[2, 2:] = 0
    return src.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("name,config", variants(), ids=[n for n, _ in variants()])
def test_cached_steps_equal_full_prefix(name, config):
    torch.manual_seed(1)
    model = Transformer(config).eval()
    src, mask = padded_batch()
    tgt = torch.randint(4, VOCAB, (3, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cross = model.encode(src, mask)
        full, _ = model.decode_step(tgt, mask, model.empty_cache(3), cross)
        past, steps = model.empty_cache(3), []
        for t in range(tgt.shape[1]):
            logits, past = model.decode_step(tgt[:, t : t + 1], mask, past, cross)
            steps.append(logits)
        # Two tokens at a time from a non-empty cache: new_len > 1 with past_len > 0.
        past2, chunks = model.empty_cache(3), []
        for t in range(0, tgt.shape[1], 2):
            logits, past2 = model.decode_step(tgt[:, t : t + 2], mask, past2, cross)
            chunks.append(logits)
    assert past[0][0].shape[2] == tgt.shape[1]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,config", variants(), ids=[n for n, _ in variants()])
def test_rows_at_different_positions_decode_as_if_alone(name, config):
    """A left-padded cache with per-row lengths (a sentence that joined a running batch, next to older ones)
    gives each row what it gets alone, whatever the padding columns hold."""
    torch.manual_seed(1)
    model = Transformer(config).eval()
    src, mask = padded_batch()
    g = torch.Generator().manual_seed(3)
    prefixes = [torch.randint(4, VOCAB, (1, n), generator=g) for n in (5, 0, 2)]
    new = torch.randint(4, VOCAB, (3, 3), generator=g)
    with torch.no_grad():
        cross = model.encode(src, mask)
        alone, pasts = [], []
        for r, prefix in enumerate(prefixes):
            row_cross = [(k[r : r + 1], v[r : r + 1]) for k, v in cross]
            past = model.empty_cache(1)
            if prefix.shape[1]:
                _, past = model.decode_step(prefix, mask[r : r + 1], past, row_cross)
            pasts.append(past)
            one, past = model.decode_step(new[r : r + 1, :1], mask[r : r + 1], past, row_cross)
            two, _ = model.decode_step(new[r : r + 1, 1:], mask[r : r + 1], past, row_cross)
            alone.append(torch.cat([one, two], 1))
        width = max(p.shape[1] for p in prefixes)

        def left_pad(t: torch.Tensor) -> torch.Tensor:  # garbage in the padding columns
            return torch.cat([torch.randn(1, t.shape[1], width - t.shape[2], t.shape[3], generator=g) * 5, t], 2)

        past = [tuple(torch.cat([left_pad(p[layer][kv]) for p in pasts]) for kv in (0, 1))
                for layer in range(config.n_decoder_layers)]
        lengths = torch.tensor([p.shape[1] for p in prefixes])
        one, past = model.decode_step(new[:, :1], mask, past, cross, lengths)
        two, present = model.decode_step(new[:, 1:], mask, past, cross, lengths + 1)
    assert present[0][0].shape[2] == width + 3
    torch.testing.assert_close(torch.cat([one, two], 1), torch.cat(alone), atol=1e-5, rtol=0)


def test_source_padding_does_not_leak():
    torch.manual_seed(0)
    model = Transformer(preset("tiny", VOCAB, VOCAB, dropout=0.0)).eval()
    src, mask = padded_batch()
    longer = torch.cat([src, torch.zeros(3, 4, dtype=torch.long)], 1)
    longer_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.long)], 1)
    tgt = torch.randint(4, VOCAB, (3, 5))
    with torch.no_grad():
        a = model(src, mask, tgt)
        b = model(longer, longer_mask, tgt)
        # Garbage under the padding must not matter either.
        noisy = longer.masked_fill(longer_mask == 0, 7)
        c = model(noisy, longer_mask, tgt)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(a, c, atol=1e-5, rtol=0)


def test_ties_share_one_tensor():
    config = preset("tiny", VOCAB, VOCAB, share_embeddings=True, tie_generator=True)
    model = Transformer(config)
    assert model.src_embed.weight is model.tgt_embed.weight is model.generator.weight


def test_sinusoid_table_matches_the_paper():
    table = sinusoid_table(50, 16)
    pos, i = 17, 3
    angle = pos / 10000 ** (2 * i / 16)
    assert table[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(angle, dtype=torch.float64)).item(),
                                                     abs=1e-7)
    assert table[pos, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(angle, dtype=torch.float64)).item(),
                                                         abs=1e-7)


def test_base_preset_has_the_papers_size():
    model = Transformer(preset("base", 32000))
    # 6+6 layers at d_model 512 with untied 32000-token embeddings and generator: about 93 M parameters.
    assert 92e6 < model.num_parameters() < 95e6
