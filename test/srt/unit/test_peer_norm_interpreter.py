"""The TP all-reduce fused with the residual add + RMSNorm (``peer_norm``) on CPU, its ranks
simulated in one process under Triton's interpreter: each rank's buffers a CPU tensor, the
peers addressed by their base addresses as on the GPU, every rank's pushes before any rank's
wait (``run_ranks_interpreted``). Its GPU test (two processes on two GPUs, torch's symmetric
memory) is test/srt/kernels/test_peer_norm.py."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
    pytest.skip("GPU present: the kernels are tested in test/srt/kernels", allow_module_level=True)

from sgl_kernel_ext.triton import norm, peer_norm  # noqa: E402

H, ROWS, EPS = 256, 4, 1e-5


def _group(world):
    """Every rank's PeerRows, their address tables naming each other's buffers."""
    bufs = [peer_norm.buffers(world, ROWS, H, "cpu") for _ in range(world)]
    recv_ptrs = torch.tensor([b[0].data_ptr() for b in bufs], dtype=torch.int64)
    flag_ptrs = torch.tensor([b[1].data_ptr() for b in bufs], dtype=torch.int64)
    return [peer_norm.PeerRows(r, world, *bufs[r][:2], recv_ptrs, flag_ptrs, bufs[r][2])
            for r in range(world)]


def _step(group, m, seed, quant=True):
    """One launch on every rank: (each rank's outputs, the expected ones), the expected from
    ``norm.add_rms_norm`` of the ranks' rows as fp32 parts summed in rank order."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(m, H, generator=g).bfloat16() for _ in group]
    res = torch.randn(m, H, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(H, generator=g)).bfloat16()
    outs, calls = [], []
    for peers, x in zip(group, xs):
        o = dict(out=torch.full((m, H), float("nan")).bfloat16(),
                 res=torch.full((m, H), float("nan")).bfloat16(),
                 q=torch.full((m, H), 7.0).to(torch.float8_e4m3fn) if quant else None,
                 s=torch.full((m, H // 128), float("nan")) if quant else None)
        outs.append(o)
        calls.append((x, peers, res, w, EPS, o["out"], o["res"], o["q"], o["s"]))
    peer_norm.run_ranks_interpreted(calls)
    want = dict(out=torch.empty(m, H).bfloat16(), res=torch.empty(m, H).bfloat16(),
                q=torch.empty(m, H).to(torch.float8_e4m3fn) if quant else None,
                s=torch.empty(m, H // 128) if quant else None)
    norm.add_rms_norm(torch.stack([x.float() for x in xs]).contiguous(), res, w, EPS,
                      want["out"], want["res"], want["q"], want["s"])
    return outs, want


def _equal(a, b):
    if a is None:
        return b is None
    if a.dtype == torch.float8_e4m3fn:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("world, m", [(2, 1), (2, 4), (4, 3), (8, 1)])
def test_every_rank_gets_the_norm_of_the_rank_ordered_sum(world, m):
    """Each rank's rows, residual and FP8 rows bitwise the norm kernel's over the ranks' rows
    summed in rank order, so every rank holds the same bits; then a second launch (the other
    half of the buffers, epoch 2) and a third (the first half again) with new rows."""
    group = _group(world)
    for launch, seed in enumerate((1, 2, 3), start=1):
        outs, want = _step(group, m, seed)
        for o in outs:
            assert all(_equal(o[k], want[k]) for k in want), (launch, world, m)
        for peers in group:
            assert peers.state.tolist() == [launch, 0, 0, 0]
            half = (launch - 1) % 2
            assert (peers.flags[half, :, :m] == launch).all()  # every rank's rows flagged
        assert not any(peer_norm.failed(p) for p in group)


def test_bf16_out_alone_and_no_residual():
    """Without the FP8 out, and a first layer's norm (no residual: residual_out is the sum)."""
    group = _group(2)
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, H, generator=g).bfloat16() for _ in group]
    w = torch.ones(H).bfloat16()
    outs = [(torch.empty(2, H).bfloat16(), torch.empty(2, H).bfloat16()) for _ in group]
    peer_norm.run_ranks_interpreted([(x, p, None, w, EPS, o, r) for x, p, (o, r)
                                     in zip(xs, group, outs)])
    want_out, want_res = torch.empty(2, H).bfloat16(), torch.empty(2, H).bfloat16()
    norm.add_rms_norm(torch.stack([x.float() for x in xs]).contiguous(), None, w, EPS,
                      want_out, want_res)
    for o, r in outs:
        assert torch.equal(o, want_out) and torch.equal(r, want_res)


def test_a_rank_that_never_pushes_makes_the_others_give_up_and_say_so(monkeypatch):
    """Rank 1 of 2 stalls (never launches): rank 0's wait gives up after SPIN_LIMIT polls and
    sets its failure word; its launch returns, no hang."""
    monkeypatch.setattr(peer_norm, "SPIN_LIMIT", 3)
    group = _group(2)
    x = torch.randn(1, H).bfloat16()
    out, res = torch.empty(1, H).bfloat16(), torch.empty(1, H).bfloat16()
    peer_norm.run_ranks_interpreted([(x, group[0], None, torch.ones(H).bfloat16(), EPS, out,
                                      res)])
    assert peer_norm.failed(group[0]) and not peer_norm.failed(group[1])


def test_mismatched_buffers_and_rows_are_refused_by_name():
    group = _group(2)
    w = torch.ones(H).bfloat16()
    out = torch.empty(ROWS + 1, H).bfloat16()
    with pytest.raises(ValueError, match="the buffers hold 1..4"):
        peer_norm.run_ranks_interpreted([(torch.zeros(ROWS + 1, H).bfloat16(), group[0], None,
                                          w, EPS, out, out)])
    with pytest.raises(ValueError, match="bf16"):
        peer_norm.run_ranks_interpreted([(torch.zeros(1, H), group[0], None, w, EPS, out[:1],
                                          out[:1])])
    narrow = torch.zeros(1, H // 2).bfloat16()
    with pytest.raises(ValueError, match="do not fit 2 ranks of 128 columns"):
        peer_norm.run_ranks_interpreted([(narrow, group[0], None, w, EPS, narrow, narrow)])
    with pytest.raises(RuntimeError, match="run_ranks_interpreted"):
        peer_norm.all_reduce_add_rms_norm(torch.zeros(1, H).bfloat16(), group[0], None, w, EPS,
                                          out[:1], out[:1])
