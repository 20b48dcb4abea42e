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


def _norm_inputs(m: int, k: int, seed: int):
    """A residual stream's row (hidden + residual, bf16) and an input norm's weight."""
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(m, k, generator=g) * 3).bfloat16()
    residual = (torch.randn(m, k, generator=g) * 8).bfloat16()
    weight = (1 + 0.3 * torch.randn(k, generator=g)).bfloat16()
    return hidden, residual, weight


def test_folded_norm_quant_is_as_accurate_as_sglangs_operand():
    """attn_side's norm_in operand (rstd out of the per-128 quantization) against SGLang's
    (e4m3 of the bf16 normed row): each within one e4m3 step of the exact s rstd w at every
    element; they differ by a step at a few percent of the elements; and the fold's squared
    error over the exact row is SGLang's within 5%."""
    hidden, residual, weight = _norm_inputs(16, 6144, 7)
    eps = 1e-5
    folded = Q.folded_norm_quant(hidden, residual, weight, eps)
    s = hidden.double() + residual.double()
    exact = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * weight.double()
    sglang = Q.dequant_act(*Q.quant_act(exact.float().bfloat16())).double()
    # one e4m3 step in each group's largest binade (32 of its 448)
    step = exact.unflatten(-1, (-1, 128)).abs().amax(-1, keepdim=True) / 448 * 32
    step = step.expand(-1, -1, 128).flatten(-2)
    for got in (folded.double(), sglang):
        assert ((got - exact).abs() <= step).all()
    # one e4m3 step apart (>= 2^-4 of the value above the subnormals), not the scales' last
    # bits (each side's scale comes from its own bf16 row's amax)
    differ = (folded.double() - sglang).abs() > 2**-6 * sglang.abs()
    frac = differ.float().mean().item()
    assert 0.002 < frac < 0.08, frac  # rounding boundaries, not a wrong scale
    ratio = ((folded.double() - exact).square().sum() / (sglang - exact).square().sum()).item()
    assert 0.95 < ratio < 1.05, ratio
    # a fold that dropped rstd is not within those bounds
    wrong = Q.dequant_act(*Q.quant_act((s.float() * weight.float()).bfloat16()))
    assert not ((wrong.double() - exact).abs() <= step).all()


def test_reference_layer_with_the_folded_input_norm():
    """FOLDED_INPUT_NORM moves only q_a|kv_a's operand of a layer without the indexer: y, the
    residual and the KV rows close to SGLang's numerics; a layer with the indexer, or one
    without an input residual, bitwise SGLang's."""
    from sglang.srt.layers.fused_decode.reference.config import tiny_config
    from sglang.srt.layers.fused_decode.testing import clone_caches, make_case
    from sglang.srt.layers.fused_decode.reference.model import layer_forward

    cfg, seen = tiny_config(), []
    for lid in range(cfg.num_hidden_layers):
        case = make_case(cfg, lid, [40, 70], seed=3, tp_size=1)
        outs = {}
        for name, num in (("sglang", Q.SGLANG), ("fold", Q.FOLDED_INPUT_NORM)):
            caches = clone_caches(case.caches)
            y, res, _ = layer_forward(cfg, [case.lw], case.hidden, case.residual, case.batch,
                                      caches, case.topk_prev, num)
            outs[name] = (y, res, caches.kv[lid][case.batch.out_slots])
        (y0, r0, kv0), (y1, r1, kv1) = outs["sglang"], outs["fold"]
        folds = case.residual is not None and not cfg.runs_indexer(lid)
        if not folds:
            assert torch.equal(y0, y1) and torch.equal(kv0, kv1) and torch.equal(r0, r1)
            continue
        seen.append(lid)
        assert (r1.float() - r0.float()).abs().max() <= 0.05 * r0.float().abs().max()
        assert not torch.equal(kv0, kv1)
        assert (kv1.float() - kv0.float()).abs().max() <= 0.05 * kv0.float().abs().max()
        assert (y1.float() - y0.float()).abs().max() <= 0.1 * y0.float().abs().max()
    assert seen, "no layer of the tiny model folds its input norm"
