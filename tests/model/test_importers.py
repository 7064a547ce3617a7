"""Importers: a foreign model built from an independent reference implementation (tests/reference_models.py),
saved with torch.save, imported, and compared: logits within 1e-5 on padded random inputs, identical greedy
tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reference_models as ref
from search import greedy
from twostep.errors import BadCheckpoint
from twostep.model.checkpoint import load_checkpoint
from twostep.model.importers import ImportOptions, import_state_dict_file
from twostep.runtime.backends.torch_backend import TorchSession
from twostep.runtime.decoding import Specials

PAD, BOS, EOS = 0, 2, 3
SRC_V, TGT_V = 37, 41


def case_annotated():
    model = ref.build_annotated(SRC_V, TGT_V, N=2, d_model=32, d_ff=64, h=4)
    return model, lambda s, t, **kw: ref.annotated_logprobs(model, s, t, pad=PAD, **kw), True, {}


def case_annotated_a2b2():
    model = ref.build_annotated(SRC_V, TGT_V, N=3, d_model=24, d_ff=40, h=3, norm="a2b2", embed_attr="embed")
    return model, lambda s, t, **kw: ref.annotated_logprobs(model, s, t, pad=PAD, **kw), True, {}


def case_jadore_shared():
    model = ref.build_jadore(TGT_V, TGT_V, d_model=32, d_inner=64, n_layers=2, n_head=4, d_k=8, d_v=12)
    return model, lambda s, t, **kw: ref.jadore_logits(model, s, t, **kw), False, {"scale_emb_or_prj": "prj"}


def case_jadore_unshared():
    model = ref.build_jadore(SRC_V, TGT_V, d_model=32, d_inner=48, n_layers=3, n_head=2, d_k=10, d_v=6,
                             trg_emb_prj_weight_sharing=True, emb_src_trg_weight_sharing=False,
                             scale_emb_or_prj="emb")
    return model, lambda s, t, **kw: ref.jadore_logits(model, s, t, **kw), False, {"scale_emb_or_prj": "emb"}


def case_mha():
    model = ref.build_mha(SRC_V, TGT_V, N=2, d_model=32, d_ff=64, h=4, max_len=80)
    return model, lambda s, t, **kw: ref.mha_logprobs(model, s, t, pad=PAD), True, {}


def case_nn_transformer():
    model = ref.build_nn_transformer(2, 3, emb_size=32, nhead=4, src_vocab_size=SRC_V, tgt_vocab_size=TGT_V,
                                     dim_feedforward=48)
    return model, lambda s, t, **kw: ref.nn_transformer_logits(model, s, t, pad=PAD, **kw), False, {}


CASES = {
    "annotated": ("annotated", case_annotated, 4),
    "annotated-a2b2-embed": ("annotated", case_annotated_a2b2, 3),
    "jadore-shared-prj": ("jadore", case_jadore_shared, 4),
    "jadore-unshared-emb": ("jadore", case_jadore_unshared, 2),
    "mha": ("mha", case_mha, 4),
    "nn-transformer": ("nn-transformer", case_nn_transformer, 4),
}


def random_batch(vocab: int, lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for row, n in enumerate(lengths):
        out[row, :n] = torch.randint(4, vocab, (n,), generator=g)
    return out


@pytest.fixture(scope="module", params=list(CASES))
def imported(request, tmp_path_factory):
    fmt, build, heads = CASES[request.param]
    foreign, scores_fn, is_logprob, extra = build()
    tmp = tmp_path_factory.mktemp(request.param)
    torch.save(foreign.state_dict(), tmp / "foreign.pt")
    import_state_dict_file(tmp / "foreign.pt", fmt, tmp / "ckpt", ImportOptions(n_heads=heads, **extra))
    ours = load_checkpoint(tmp / "ckpt").model  # through the saved checkpoint, not the in-memory model
    return ours, scores_fn, is_logprob


def test_logits_match_foreign_model(imported):
    ours, scores_fn, is_logprob = imported
    src = random_batch(SRC_V, [9, 5, 1], seed=1)
    tgt_lengths = [7, 3, 5]
    tgt = random_batch(TGT_V, tgt_lengths, seed=2)
    with torch.no_grad():
        theirs = scores_fn(src, tgt)
        logits = ours(src, (src != PAD).long(), tgt)
        mine = F.log_softmax(logits, -1) if is_logprob else logits
    for row, n in enumerate(tgt_lengths):  # pad rows of the target are not outputs
        torch.testing.assert_close(mine[row, :n], theirs[row, :n], atol=1e-5, rtol=0)


def test_greedy_tokens_match_foreign_model(imported):
    ours, scores_fn, _ = imported
    lengths = [6, 11, 2, 8]
    src = random_batch(SRC_V, lengths, seed=3)
    with torch.no_grad():
        expected = ref.reference_greedy(lambda s, ys: scores_fn(s, ys, mask_tgt_pad=False), src, BOS, EOS, 12)
    sources = [src[row, :n].tolist() for row, n in enumerate(lengths)]
    got = greedy(TorchSession(ours), sources, specials=Specials(pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=1),
                 max_new_tokens=12)
    assert got == expected


def test_every_format_has_a_case():
    from twostep.model.importers import IMPORTERS

    assert {fmt for fmt, _, _ in CASES.values()} == set(IMPORTERS)


def test_missing_and_misshapen_tensors_are_listed_in_one_error(tmp_path):
    sd = ref.build_annotated(SRC_V, TGT_V).state_dict()
    del sd["encoder.layers.1.feed_forward.w_2.bias"]
    sd["decoder.layers.0.src_attn.linears.2.weight"] = torch.zeros(31, 32)
    sd["encoder.extra.weight"] = torch.zeros(3)
    torch.save(sd, tmp_path / "broken.pt")
    with pytest.raises(BadCheckpoint) as info:
        import_state_dict_file(tmp_path / "broken.pt", "annotated", tmp_path / "out", ImportOptions(n_heads=4))
    message = str(info.value)
    assert "3 problem(s)" in message
    assert "missing encoder.layers.1.feed_forward.w_2.bias" in message
    assert ("decoder.layers.0.src_attn.linears.2.weight -> decoder.layers.0.cross_attn.v_proj.weight: "
            "shape (31, 32), expected (32, 32)") in message
    assert "unmapped encoder.extra.weight" in message
    assert not (tmp_path / "out").exists()


def test_wrong_format_says_so(tmp_path):
    torch.save(ref.build_mha(SRC_V, TGT_V, max_len=50).state_dict(), tmp_path / "mha.pt")
    with pytest.raises(BadCheckpoint, match="not a 'jadore' state dict"):
        import_state_dict_file(tmp_path / "mha.pt", "jadore", tmp_path / "out", ImportOptions(n_heads=4))


def test_pickled_code_is_refused(tmp_path):
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "module.pt")  # a whole module, not a state dict
    with pytest.raises(BadCheckpoint, match="weights_only=True"):
        import_state_dict_file(tmp_path / "module.pt", "annotated", tmp_path / "out", ImportOptions(n_heads=4))


@pytest.mark.parametrize("case", ["annotated", "jadore-shared-prj", "nn-transformer"])
def test_a_state_dict_without_its_position_buffer(case, tmp_path):
    """Saved without the (non-persistent) position buffer: --max-positions rebuilds the seeds' sinusoidal
    table, and the logits still match the foreign model; without it, one clear error."""
    fmt, build, heads = CASES[case]
    foreign, scores_fn, is_logprob, extra = build()
    table = {"annotated": "src_embed.1.pe", "jadore-shared-prj": "encoder.position_enc.pos_table",
             "nn-transformer": "positional_encoding.pos_embedding"}[case]
    state = {k: v for k, v in foreign.state_dict().items()
             if not k.endswith((".pe", "position_enc.pos_table", "pos_embedding"))}
    assert table not in state
    torch.save(state, tmp_path / "foreign.pt")
    with pytest.raises(BadCheckpoint, match=f"no position table {table}.*--max-positions"):
        import_state_dict_file(tmp_path / "foreign.pt", fmt, tmp_path / "none", ImportOptions(n_heads=heads, **extra))
    import_state_dict_file(tmp_path / "foreign.pt", fmt, tmp_path / "ckpt",
                           ImportOptions(n_heads=heads, max_positions=40, **extra))
    ours = load_checkpoint(tmp_path / "ckpt").model
    assert ours.config.max_positions == 40
    src, tgt = random_batch(SRC_V, [9, 5], seed=4), random_batch(TGT_V, [7, 3], seed=5)
    with torch.no_grad():
        theirs = scores_fn(src, tgt)
        logits = ours(src, (src != PAD).long(), tgt)
        mine = F.log_softmax(logits, -1) if is_logprob else logits
    for row, n in enumerate([7, 3]):
        torch.testing.assert_close(mine[row, :n], theirs[row, :n], atol=1e-5, rtol=0)


def test_max_positions_beyond_the_table_is_one_error(tmp_path):
    foreign, *_ = case_annotated()
    torch.save(foreign.state_dict(), tmp_path / "foreign.pt")
    rows = foreign.state_dict()["src_embed.1.pe"].shape[-2]
    with pytest.raises(BadCheckpoint, match=f"--max-positions {rows + 1} is more than the {rows} rows"):
        import_state_dict_file(tmp_path / "foreign.pt", "annotated", tmp_path / "ck",
                               ImportOptions(n_heads=4, max_positions=rows + 1))


class RunsCode:
    """A pickle whose loading runs a shell command: what a malicious checkpoint looks like."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_runs_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"encoder.weight": RunsCode(marker)}, tmp_path / "evil.pt")
    with pytest.raises(BadCheckpoint, match="weights_only=True"):
        import_state_dict_file(tmp_path / "evil.pt", "annotated", tmp_path / "out", ImportOptions(n_heads=4))
    assert not marker.exists() and not (tmp_path / "out").exists()
