"""FP8 numerics of the reference: e4m3 casts on CPU, block weights, per-128-group activations,
index vectors; compared with upstream's torch-native block dequant where it is installed."""

import pytest
import torch

from sglang.srt.layers.fused_decode.reference import quant as Q


def test_cpu_e4m3_cast_rounds_to_nearest():
    # the Triton-interpreter trap (127.9 -> 64) must not exist in torch's CPU cast
    x = torch.tensor([127.9, 448.0, 449.0, 0.0, -3.3, 1e-9, 240.0, 232.0, 248.0])
    q = x.to(Q.FP8).to(torch.float32)
    assert q.tolist()[:2] == [128.0, 448.0]
    assert q[3] == 0 and q[4] == -3.25 and q[5] == 0
    assert q[6] == 240 and q[7] == 224 and q[8] == 256  # ties to even: 232 -> 224, 248 -> 256
    # every e4m3 value round-trips exactly
    allv = torch.arange(256, dtype=torch.uint8).view(Q.FP8).to(torch.float32)
    finite = allv[torch.isfinite(allv)]
    assert torch.equal(finite.to(Q.FP8).to(torch.float32), finite)


def test_act_quant_per_group():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 384, generator=g) * torch.tensor([1.0, 30.0, 0.01]).repeat_interleave(128)).bfloat16()
    q, s = Q.quant_act(x)
    assert q.dtype == Q.FP8 and s.shape == (5, 3)
    amax = x.float().unflatten(-1, (3, 128)).abs().amax(-1)
    torch.testing.assert_close(s, amax / 448.0)
    assert (q.float().unflatten(-1, (3, 128)).abs().amax(-1) == 448).all()  # the max maps to 448
    deq = Q.dequant_act(q, s)
    rel = ((deq - x.float()).abs() / amax.repeat_interleave(128, -1)).max()
    assert rel <= 2**-4  # e4m3: 3 mantissa bits
    zq, zs = Q.quant_act(torch.zeros(2, 128))
    assert torch.all(zs == 1e-10 / 448) and torch.all(zq.float() == 0)


def test_block_weight_round_trip_and_partial_blocks():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(200, 300, generator=g)
    fw = Q.quant_block(w)
    assert fw.q.shape == (200, 300) and fw.s.shape == (2, 3)
    d = fw.dequant()
    assert ((d - w).abs() <= w.abs().amax() * 2**-4).all()
    again = Q.quant_block(d)  # a dequantized weight re-quantizes to itself
    torch.testing.assert_close(again.dequant(), d, rtol=0, atol=1e-6)


def test_fp8_linear_modes():
    g = torch.Generator().manual_seed(2)
    w = Q.quant_block(torch.randn(256, 384, generator=g) / 20)
    x = torch.randn(3, 384, generator=g).bfloat16()
    exact = x.float() @ w.dequant().T
    y32 = Q.fp8_linear(x, w, Q.FP32)
    assert y32.dtype == torch.float32 and torch.equal(y32, exact)
    y = Q.fp8_linear(x, w, Q.SGLANG)
    assert y.dtype == torch.bfloat16
    xq = Q.dequant_act(*Q.quant_act(x))
    assert torch.equal(y, (xq @ w.dequant().T).bfloat16())
    assert not torch.equal(y.float(), exact.bfloat16().float())  # activation quantization is applied


def test_index_vec_quant():
    x = torch.randn(4, 3, 128)
    q, s = Q.quant_index_vec(x)
    torch.testing.assert_close(s, x.abs().amax(-1) / 448)
    _, s0 = Q.quant_index_vec(torch.zeros(1, 128))
    assert s0.item() == pytest.approx(1e-4 / 448)


def test_matches_upstream_block_quant_dequant():
    fp8_utils = pytest.importorskip(
        "sglang.srt.layers.quantization.fp8_utils", reason="upstream sglang not installed"
    )
    g = torch.Generator().manual_seed(3)
    fw = Q.quant_block(torch.randn(2, 200, 300, generator=g))
    up = fp8_utils.block_quant_dequant(fw.q, fw.s, [128, 128], torch.float32)
    assert torch.equal(up, fw.dequant())
