"""The fused decode kernels on CPU under Triton's interpreter, at the tiny config: indexing,
masking, cache writes and control flow (numerics are checked on the GPU; the interpreter
truncates bf16 casts, so these tolerances are looser: NUMERICS['fused_layer_interpreter'])."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
    pytest.skip("GPU present: the kernels are tested in test/srt/kernels", allow_module_level=True)

from sgl_kernel_ext.triton import bf16_linear, fp8_linear, moe  # noqa: E402
from sgl_kernel_ext.triton.topk import topk_positions  # noqa: E402
from sglang.srt.layers.fused_decode.layer import FusedLayer  # noqa: E402
from sglang.srt.layers.fused_decode.reference import indexer as ref_indexer  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import tiny_config  # noqa: E402
from sglang.srt.layers.fused_decode.reference.moe import moe_partial, router  # noqa: E402
from sglang.srt.layers.fused_decode.reference.quant import (  # noqa: E402
    SGLANG,
    Numerics,
    fp8_linear as ref_fp8_linear,
    quant_act,
    quant_block,
)
from sglang.srt.layers.fused_decode.reference.weights import gen_layer  # noqa: E402
from sglang.srt.layers.fused_decode.spec import NUMERICS  # noqa: E402
from sglang.srt.layers.fused_decode.testing import (  # noqa: E402
    compare_two_ranks,
    carried_topk_checks,
    clone_caches,
    compare_with_reference,
    make_case,
    pool_table_checks,
    shard_rows_checks,
    stack_with_and_without_workspace,
)

CFG = tiny_config()
FP32_OUT = Numerics(act_dtype=torch.float32, act_fp8=True)  # FP8 activations, no rounding
BF16_ULP = 2.0 ** -7  # relative spacing of bf16; the interpreter truncates instead of rounding


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("split", [1, 3])
def test_norm_weight_before_the_wait_is_bitwise_the_plain_norm(split, monkeypatch):
    """norm.W_EARLY_MAX_ROWS: the weight comes in before the wait, the arithmetic is the same
    (its other form, the next kernel launched after rstd, exists only with the overlap: GPU)."""
    from sgl_kernel_ext.triton import norm

    g = torch.Generator().manual_seed(5)
    m, h = 3, 384
    x = torch.randn(split, m, h, generator=g)
    res = torch.randn(m, h, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(torch.bfloat16)
    outs = []
    for early in (0, 16):
        monkeypatch.setattr(norm, "W_EARLY_MAX_ROWS", early)
        out = torch.full((m, h), float("nan"), dtype=torch.bfloat16)
        res_out = torch.full((m, h), float("nan"), dtype=torch.bfloat16)
        xq = torch.full((m, h), float("nan")).to(torch.float8_e4m3fn)
        xs = torch.full((m, h // 128), float("nan"))
        norm.add_rms_norm(x if split > 1 else x[0].to(torch.bfloat16), res, w, 1e-5, out,
                          res_out, xq, xs)
        outs.append((out, res_out, xq, xs))
    for a, b in zip(*outs):
        assert torch.isfinite(a.float()).all()
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
    s = x.sum(0).to(torch.bfloat16).float() + res.float()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    assert _rel(outs[0][0], y) <= 4 * BF16_ULP


@pytest.mark.parametrize("rows, split, gemv", [(1, 1, False), (3, 2, False), (16, 3, False),
                                               (1, 2, True), (2, 3, True)])
def test_fp8_linear_split_k_two_matrices_one_launch(rows, split, gemv, monkeypatch):
    """The split-K partials of both matrices sum to the product, on the tensor cores or
    (gemv) without them (fp8_linear.GEMV_MAX_ROWS)."""
    monkeypatch.setattr(fp8_linear, "GEMV_MAX_ROWS", rows if gemv else 0)
    monkeypatch.setattr(fp8_linear, "GEMV_BLOCK_N", 16)  # 40 of W_b's rows: a partial tile
    monkeypatch.setattr(fp8_linear, "GEMV_GROUPS", 4)  # chunks past K: empty partials
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 640, generator=g).bfloat16()  # 5 groups: a ragged last chunk
    wa = quant_block(torch.randn(200, 640, generator=g) * 0.05)  # partial last N block
    wb = quant_block(torch.randn(40, 640, generator=g) * 0.05)
    pa = torch.full((split, rows, 200), float("nan"))
    pb = torch.full((split, rows, 40), float("nan"))
    xq, sx = quant_act(x)
    fp8_linear.fp8_linear(xq, sx.contiguous(), wa.q, wa.s, pa, wb.q, wb.s, pb)
    torch.testing.assert_close(pa.sum(0), ref_fp8_linear(x, wa, FP32_OUT), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pb.sum(0), ref_fp8_linear(x, wb, FP32_OUT), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 3])
def test_scales_loaded_ahead_are_bitwise_the_plain_loop(rows, monkeypatch):
    """The MMA loops with each group's scales loaded an iteration ahead
    (fp8_linear.SCALES_AHEAD): the linear's partials (1, 2 and 4 groups a step, a ragged last
    K chunk whose clamped groups are masked) and gate/up's MMAs (32 columns stacked, its split K
    at 1-2 rows, none at 3; stacked or 64 columns apart over two K steps) write the plain
    loop's bits, every element."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 640, generator=g).bfloat16()  # 5 groups
    w = quant_block(torch.randn(192, 640, generator=g) * 0.05)
    xq, sx = quant_act(x)
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    mw, sh, e, k = lw.mlp, lw.mlp.shared, CFG.n_routed_experts, CFG.num_experts_per_tok
    hq, hs = quant_act(torch.randn(rows, CFG.hidden_size, generator=g).bfloat16())
    slots = rows * k + 1
    se = torch.tensor([e] + [(2 * i) % e for i in range(slots - 1)], dtype=torch.int32)
    ns = torch.tensor([slots], dtype=torch.int32)
    # the layer's (32 columns stacked), and 32 stacked or 64 apart in two K steps of a group
    tilings = [moe.gate_up_tiling(rows), (32, 1, 1), (64, 1, 1)]
    assert moe.gate_up_stack(tilings[0][0], False) and not moe.gate_up_stack(64, False)
    runs = []
    monkeypatch.setattr(moe, "GATE_UP_64_SCALES_AHEAD", True)  # opt-in: tested here too
    for ahead in (False, True):
        monkeypatch.setattr(fp8_linear, "SCALES_AHEAD", ahead)
        out = []
        for groups in (1, 2, 4):
            parts = torch.full((2, rows, 192), float("nan"))
            fp8_linear.fp8_linear(xq, sx.contiguous(), w.q, w.s, parts, groups=groups)
            out.append(parts)
        for tiling in tilings:
            act = torch.full((slots, rows, mw.gate.q.shape[1]), float("nan"),
                             dtype=torch.bfloat16)
            gu_parts = torch.full((tiling[2], slots, rows, 2, act.shape[2]), float("nan"))
            moe.gate_up(hq, hs.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q,
                        mw.up.s, sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act,
                        gu_parts if tiling[2] > 1 else None, tiling=tiling)
            out.append(act)
        runs.append(out)
    for plain, ahead in zip(*runs):
        assert not torch.isnan(plain.float()).any() and torch.equal(plain, ahead)


@pytest.mark.parametrize("both", [True, False],
                         ids=["rows_and_sums_of_squares", "w_a_rows_only"])
def test_fp8_linear_tails_sum_each_column_tile(both):
    """With tails the last K chunk of each column tile to finish stores the tile summed over
    the partials in split order, converted to bf16 (bitwise what a consumer summing the
    partials would get), with (both) each row's per-tile sum of squares and W_b's tiles too,
    or (rows only, W_a only: mla.ABSORB_Q_ROWS_FROM's form) nothing for W_b; partial last
    tiles, a ragged last K chunk; the counters back at zero."""
    rows, split = 3, 3
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, 640, generator=g).bfloat16()
    wa = quant_block(torch.randn(200, 640, generator=g) * 0.05)
    wb = quant_block(torch.randn(40, 640, generator=g) * 0.05)
    pa = torch.full((split, rows, 200), float("nan"))
    pb = torch.full((split, rows, 40), float("nan"))
    xq, sx = quant_act(x)
    tiles_a, tiles_b = -(-200 // 64), -(-40 // 64)
    arrivals = torch.zeros(tiles_a + tiles_b, dtype=torch.int32)
    rows_a = torch.full((rows, 200), float("nan"), dtype=torch.bfloat16)
    rows_b = torch.full((rows, 40), float("nan"), dtype=torch.bfloat16)
    ss_a = torch.full((rows, tiles_a), float("nan"))
    ss_b = torch.full((rows, tiles_b), float("nan"))
    tails = (arrivals, rows_a, ss_a, rows_b, ss_b) if both else (arrivals, rows_a, None, None,
                                                                  None)
    fp8_linear.fp8_linear(xq, sx.contiguous(), wa.q, wa.s, pa, wb.q, wb.s, pb, tails=tails)
    assert not arrivals.any()
    for parts, out, ss, tiles in ((pa, rows_a, ss_a, tiles_a), (pb, rows_b, ss_b, tiles_b)):
        if out is rows_b and not both:
            assert torch.isnan(rows_b.float()).all() and torch.isnan(ss_b).all()
            continue
        total = (parts[0] + parts[1]) + parts[2]
        want = total.bfloat16()
        # the interpreter's bf16 conversion truncates; the GPU's rounds to nearest
        cut = (total.view(torch.int32) & -65536).view(torch.float32).bfloat16()
        bits = out.view(torch.int16)
        assert bool(((bits == want.view(torch.int16)) | (bits == cut.view(torch.int16))).all())
        if both:
            sq = torch.nn.functional.pad(out.float() ** 2, (0, tiles * 64 - out.shape[1]))
            torch.testing.assert_close(ss, sq.view(rows, tiles, 64).sum(-1), rtol=1e-5, atol=0)
        else:
            assert torch.isnan(ss_a).all()


def test_fp8_linear_fixed_sums_are_the_partials_summed():
    """With sums each K chunk is added into int64 sums in 2^-32 units (quant.add_fixed) and
    no partial is stored: the sums, read back (quant.load_fixed's arithmetic), are the split
    partials' total to fp32 rounding; a partial last tile, a ragged last K chunk."""
    rows, split = 3, 3
    g = torch.Generator().manual_seed(9)
    x = torch.randn(rows, 640, generator=g).bfloat16()
    w = quant_block(torch.randn(200, 640, generator=g) * 0.05)
    xq, sx = quant_act(x)
    parts = torch.full((split, rows, 200), float("nan"))
    fp8_linear.fp8_linear(xq, sx.contiguous(), w.q, w.s, parts)
    total = (parts[0] + parts[1]) + parts[2]
    unused = torch.full((split, rows, 200), float("nan"))
    sums = torch.zeros(rows, 200, dtype=torch.int64)
    fp8_linear.fp8_linear(xq, sx.contiguous(), w.q, w.s, unused, sums=sums)
    assert torch.isnan(unused).all(), "a partial stored beside the sums"
    got = sums.double() * 2.0 ** -32
    err = (got - total.double()).abs()
    assert float(err.max()) <= 4 * 2.0 ** -24 * float(total.abs().max()) + split * 2.0 ** -32
    with pytest.raises(AssertionError, match="one matrix, no tails"):
        fp8_linear.fp8_linear(xq, sx.contiguous(), w.q, w.s, unused, w.q, w.s, unused, sums=sums)


@pytest.mark.parametrize("rows, gemv", [(5, False), (1, True), (2, True)])
def test_bf16_split_k_sums_to_the_product(rows, gemv, monkeypatch):
    """On the tensor cores, or (gemv) each K chunk as one load multiplied and summed in fp32
    (bf16_linear.GEMV_MAX_ROWS); 640 columns in chunks of 256: the third of 128, the fourth empty."""
    monkeypatch.setattr(bf16_linear, "GEMV_MAX_ROWS", rows if gemv else 0)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 640, generator=g).bfloat16()
    w = torch.randn(48, 640, generator=g).bfloat16()
    parts = torch.full((4, rows, 48), float("nan"))
    bf16_linear.bf16_linear_splitk(x, w, parts)
    torch.testing.assert_close(parts.sum(0), x.float() @ w.float().T, rtol=1e-5, atol=1e-4)


def test_moe_route_slots_and_combine():
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    mw, m = lw.mlp, 5
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, CFG.hidden_size, generator=g).bfloat16()
    pos = torch.tensor([3, 4, -1, 7, 9])
    ids, weights = router(CFG, mw, x)
    e, k = CFG.n_routed_experts, CFG.num_experts_per_tok
    parts = torch.empty(2, m, e)
    bf16_linear.bf16_linear_splitk(x, mw.router, parts)
    slots = m * k + 1
    se = torch.full((slots,), -7, dtype=torch.int32)
    sw = torch.full((slots, m), float("nan"))
    sr = torch.full((slots, m), -7, dtype=torch.int32)
    ns = torch.zeros(1, dtype=torch.int32)
    moe.route(parts, mw.bias, pos, k, CFG.routed_scaling_factor, True, se, sw, sr, ns)
    valid = pos >= 0
    n = int(ns)
    assert se[0] == e and se[1:n].tolist() == sorted(set(ids[valid].flatten().tolist()))
    for s in range(1, n):  # routed weights per (slot, row); pad row gets none
        for r in range(m):
            hit = (ids[r] == se[s]) & valid[r]
            want = float(weights[r][hit].sum()) if hit.any() else 0.0
            assert abs(float(sw[s, r]) - want) <= 1e-5 * max(1.0, abs(want))
            chosen = sorted(ids[r].tolist()) if valid[r] else []
            rank = chosen.index(int(se[s])) + 1 if int(se[s]) in chosen else -1
            assert int(sr[s, r]) == rank
    inter = mw.gate.q.shape[1]
    act = torch.full((slots, m, inter), float("nan"), dtype=torch.bfloat16)
    sh = mw.shared
    xq, sx = quant_act(x)
    # SGLang holds gate|up as one [E, 2I, K] stack: pass the halves as strided views
    w13_q = torch.cat([mw.gate.q.view(torch.uint8), mw.up.q.view(torch.uint8)], 1).view(mw.gate.q.dtype)
    w13_s = torch.cat([mw.gate.s, mw.up.s], 1)
    rows_s = mw.gate.s.shape[1]
    moe.gate_up(xq, sx.contiguous(), e, se, ns, w13_q[:, :inter], w13_s[:, :rows_s],
                w13_q[:, inter:], w13_s[:, rows_s:], sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act)
    out = torch.full((m, CFG.hidden_size), float("nan"), dtype=torch.bfloat16)
    terms = torch.full((m, k + 1, CFG.hidden_size), float("nan"), dtype=torch.bfloat16)
    moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s, pos, terms, out)
    ref = moe_partial(CFG, mw, x, ids, weights, SGLANG)
    assert not torch.isnan(out[valid]).any()
    assert _rel(out[valid], ref[valid]) <= 8 * BF16_ULP


def _route_outputs(parts, bias, pos, k, tail, x=None, w=None):
    """(slot experts, weights, ranks) of route (tail: router_route, the GEMV's last program
    routing every row; then parts is overwritten from x . w^T) on poisoned buffers."""
    split, m, e = parts.shape
    slots = m * k + 1
    se = torch.full((slots,), -7, dtype=torch.int32)
    sw = torch.full((slots, m), float("nan"))
    sr = torch.full((slots, m), -7, dtype=torch.int32)
    ns = torch.zeros(1, dtype=torch.int32)
    arrival = torch.zeros(1, dtype=torch.int32)
    scratch = (torch.full((m * e,), -7, dtype=torch.int32), torch.full((m * e,), float("nan")),
               arrival)
    if tail:
        moe.router_route(x, w, parts, bias, pos, k, 2.5, True, se, sw, sr, ns, arrival, scratch)
    else:
        moe.route(parts, bias, pos, k, 2.5, True, se, sw, sr, ns, scratch)
    assert int(arrival) == 0
    n = int(ns)
    return se[:n], sw[:n], sr[:n]


@pytest.mark.parametrize("m, experts, k, tail", [(1, 16, 4, False), (2, 16, 4, True),
                                                  (5, 16, 4, False), (16, 256, 8, True),
                                                  (3, 24, 6, False)])
def test_route_top_k_by_sort_picks_as_the_argmax_passes(m, experts, k, tail, monkeypatch):
    """moe.ROUTE_SORT (one bitonic top-k of (value, expert) keys) against the argmax passes:
    bitwise the same slot list, weights and ranks, on random logits and on logits with ties
    (equal choices must go to the lower expert) and negative choices; a pad row chooses
    nothing. 24 experts (a 32-wide tile) and k = 6 (top-8 keys, the sixth
    the threshold); tail: the router's last GEMV program routes every row. The sort runs on
    one-row tiles from route's one program a row (moe.ROUTE_ROW_TILE_MIN), the passes on two."""
    g = torch.Generator().manual_seed(m * 1000 + experts)
    pos = torch.arange(m) + 3
    pos[m // 2] = -1 if m > 1 else pos[0]
    hidden = 256
    x = torch.randn(m, hidden, generator=g).bfloat16()
    w = torch.randn(experts, hidden, generator=g).bfloat16() * 0.1
    for ties in (False, True):
        parts = torch.randn(2, m, experts, generator=g)
        bias = torch.randn(experts, generator=g) * 0.1
        if ties:  # choices in few distinct values, some negative
            parts = torch.zeros(2, m, experts)
            parts[0] = torch.randint(-2, 3, (m, experts), generator=g).float()
            bias = -torch.sigmoid(parts[0, 0])  # row 0's choices all exactly 0
        runs = []
        for sort in (False, True):
            monkeypatch.setattr(moe, "ROUTE_SORT", sort)
            # the argmax passes on 2-row tiles (a masked-off row in route's one program a row)
            monkeypatch.setattr(moe, "ROUTE_ROW_TILE_MIN", 1 if sort else 2)
            monkeypatch.setattr(moe, "ROUTE_TAIL_MAX_ROWS", 16 if tail else 2)
            runs.append(_route_outputs(parts.clone(), bias, pos, k, tail and not ties, x, w))
        for a, b in zip(*runs):
            assert torch.equal(a.nan_to_num(-1e30), b.nan_to_num(-1e30)), (ties, a, b)
        if m > 1:  # the pad row has no weight or rank in any routed slot
            assert (runs[1][1][1:, m // 2] == 0).all() and (runs[1][2][1:, m // 2] == -1).all()


def _moe_rows(m, seed):
    """(MoE weights, shared expert's, x bf16 [m, H], positions with a pad row second from 2
    rows, x quantized, its scales) of the tiny config's layer 0, TP rank 1 of 2."""
    mw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1).mlp
    x = torch.randn(m, CFG.hidden_size, generator=torch.Generator().manual_seed(seed)).bfloat16()
    pos = torch.tensor([3, -1, 7, 9, 11][:m]) if m > 1 else torch.tensor([5])
    xq, sx = quant_act(x)
    return mw, mw.shared, x, pos, xq, sx


def _poisoned_route_buffers(m, e, slots, tiles):
    """([route's arrival counter, gate/up's (tile, slot) counters], router partials, slot
    experts, weights, ranks, slot count) for m rows of e experts, poisoned (counters zero)."""
    arr = [torch.zeros(n, dtype=torch.int32) for n in (1, tiles * slots)]
    return (arr, torch.full((2, m, e), float("nan")), torch.full((slots,), -7, dtype=torch.int32),
            torch.full((slots, m), float("nan")), torch.full((slots, m), -7, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("m", [1, 2, 5])
def test_moe_last_arrival_tails_are_bitwise_the_separate_kernels(m):
    """router+route and gate/up+SwiGLU as one launch each (the last program of a group runs
    the second part) against the two-launch forms: bitwise equal outputs and every arrival
    counter back at zero. 5 rows: route runs one program per row, the last building the slot
    list, and gate/up splits no K."""
    mw, sh, x, pos, xq, sx = _moe_rows(m, m)
    e, k = CFG.n_routed_experts, CFG.num_experts_per_tok
    slots, inter, h = m * k + 1, mw.gate.q.shape[1], CFG.hidden_size
    block_n, _, split_k = moe.gate_up_tiling(m)
    runs = []
    for tails in (False, True):
        arr, parts, se, sw, sr, ns = _poisoned_route_buffers(m, e, slots, -(-inter // block_n))
        if tails:
            scratch = (torch.full((m * e,), -7, dtype=torch.int32), torch.full((m * e,), float("nan")),
                       arr[0])
            moe.router_route(x, mw.router, parts, mw.bias, pos, k, CFG.routed_scaling_factor,
                             True, se, sw, sr, ns, arr[0], scratch)
        else:
            bf16_linear.bf16_linear_splitk(x, mw.router, parts)
            moe.route(parts, mw.bias, pos, k, CFG.routed_scaling_factor, True, se, sw, sr, ns)
        act = torch.full((slots, m, inter), float("nan"), dtype=torch.bfloat16)
        gu_parts = torch.full((split_k, slots, m, 2, inter), float("nan")) if split_k > 1 else None
        moe.gate_up(xq, sx.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s,
                    sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act, gu_parts,
                    arrivals=arr[1] if tails else None)
        out = torch.full((m, h), float("nan"), dtype=torch.bfloat16)
        terms = torch.full((m, k + 1, h), float("nan"), dtype=torch.bfloat16)
        moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s, pos, terms,
                 out)
        n = int(ns)
        runs.append((se[:n], sw[:n], sr[:n], act[:n].float(), out.float()))
        assert not any(c.any() for c in arr), arr
    assert not torch.isnan(runs[1][-1]).any()
    for a, b in zip(*runs):
        assert torch.equal(a.nan_to_num(-1e30), b.nan_to_num(-1e30))


@pytest.mark.parametrize("m, tail", [(1, True), (2, True), (2, False), (3, False)])
def test_moe_routing_in_gate_up_is_bitwise_the_slot_table(m, tail):
    """gate/up routing every row itself from the router's partials (moe.Routing: the
    router's launch without its route) against route's slot table: bitwise the same
    activations and output, the same table written (by gate/up, down reading it), every
    arrival counter back at zero; a pad row (2 and 3 rows) chooses nothing. tail: gate/up's
    SwiGLU as its last K chunk's tail (else SwiGLU's own kernel reads the table gate/up
    wrote)."""
    mw, sh, x, pos, xq, sx = _moe_rows(m, 10 + m)
    e, k = CFG.n_routed_experts, CFG.num_experts_per_tok
    slots, inter, h = m * k + 1, mw.gate.q.shape[1], CFG.hidden_size
    block_n, _, split_k = moe.gate_up_tiling(m)
    runs = []
    for in_kernels in (False, True):
        arr, parts, se, sw, sr, ns = _poisoned_route_buffers(m, e, slots, -(-inter // block_n))
        scratch = (torch.full((m * e,), -7, dtype=torch.int32), torch.full((m * e,), float("nan")),
                   arr[0])
        moe.router_route(x, mw.router, parts, mw.bias, pos, k, CFG.routed_scaling_factor, True,
                         se, sw, sr, ns, arr[0], scratch, routes=not in_kernels)
        if in_kernels:  # the router wrote no table
            assert (se == -7).all() and int(ns) == 0 and torch.isnan(sw).all()
        routing = moe.Routing(parts, mw.bias, pos, k, CFG.routed_scaling_factor, True, sw,
                              sr) if in_kernels else None
        act = torch.full((slots, m, inter), float("nan"), dtype=torch.bfloat16)
        gu_parts = torch.full((split_k, slots, m, 2, inter), float("nan")) if split_k > 1 else None
        moe.gate_up(xq, sx.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s,
                    sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act, gu_parts,
                    arrivals=arr[1] if tail else None, route=routing)
        out = torch.full((m, h), float("nan"), dtype=torch.bfloat16)
        terms = torch.full((m, k + 1, h), float("nan"), dtype=torch.bfloat16)
        moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s, pos, terms,
                 out, table_early=routing is None)
        n = int(ns)
        runs.append((se[:n], sw[:n], sr[:n], act[:n].float(), out.float()))
        assert not any(c.any() for c in arr), arr
    assert n == 1 + len(set(runs[0][0][1:].tolist())) and n > 1
    assert not torch.isnan(runs[1][-1]).any()
    for a, b in zip(*runs):
        assert torch.equal(a.nan_to_num(-1e30), b.nan_to_num(-1e30))


@pytest.mark.parametrize("m", [2, 5])
def test_moe_slot_waits_are_bitwise_the_whole_wait(m):
    """down waiting per slot on gate/up's counters (moe.SlotWait) against down after all of
    gate/up: bitwise the same terms' sum, every counter zeroed by the sum and the failure word
    clear. 2 rows: each (tile, slot) counted by gate/up's SwiGLU tail; 5: by the program."""
    mw, sh, x, pos, xq, sx = _moe_rows(m, 20 + m)
    e, k = CFG.n_routed_experts, CFG.num_experts_per_tok
    slots, inter, h = m * k + 1, mw.gate.q.shape[1], CFG.hidden_size
    block_n, _, split_k = moe.gate_up_tiling(m)
    tiles = -(-inter // block_n)
    runs = []
    for waits in (False, True):
        arr, parts, se, sw, sr, ns = _poisoned_route_buffers(m, e, slots, tiles)
        bf16_linear.bf16_linear_splitk(x, mw.router, parts)
        moe.route(parts, mw.bias, pos, k, CFG.routed_scaling_factor, True, se, sw, sr, ns)
        ready = moe.SlotWait(torch.zeros(slots + 3, dtype=torch.int32),
                             torch.zeros(1, dtype=torch.int32), tiles) if waits else None
        act = torch.full((slots, m, inter), float("nan"), dtype=torch.bfloat16)
        gu_parts = torch.full((split_k, slots, m, 2, inter), float("nan")) if split_k > 1 else None
        moe.gate_up(xq, sx.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s,
                    sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act, gu_parts, arrivals=arr[1],
                    ready=ready)
        if waits:  # every (tile, slot) of the list counted once, no slot past it
            n = int(ns)
            assert ready.ready.tolist() == [tiles] * n + [0] * (slots + 3 - n)
        out = torch.full((m, h), float("nan"), dtype=torch.bfloat16)
        terms = torch.full((m, k + 1, h), float("nan"), dtype=torch.bfloat16)
        moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s, pos, terms,
                 out, ready=ready)
        if waits:
            assert not ready.ready.any() and not moe.slot_wait_failed(ready.failed)
        runs.append(out)
    assert not torch.isnan(runs[0]).any()
    assert torch.equal(runs[0], runs[1])


def test_moe_slot_wait_gives_up_instead_of_hanging(monkeypatch):
    """A slot whose activations are never counted: down's wait gives up after
    moe.DOWN_WAIT_POLLS polls and sets the failure word (the terms are then wrong), and the
    counters are zeroed all the same."""
    m = 5
    mw, sh, x, pos, xq, sx = _moe_rows(m, 3)
    e, k = CFG.n_routed_experts, CFG.num_experts_per_tok
    slots, inter, h = m * k + 1, mw.gate.q.shape[1], CFG.hidden_size
    tiles = -(-inter // moe.gate_up_tiling(m)[0])
    arr, parts, se, sw, sr, ns = _poisoned_route_buffers(m, e, slots, tiles)
    bf16_linear.bf16_linear_splitk(x, mw.router, parts)
    moe.route(parts, mw.bias, pos, k, CFG.routed_scaling_factor, True, se, sw, sr, ns)
    ready = moe.SlotWait(torch.full((slots,), tiles, dtype=torch.int32),
                         torch.zeros(1, dtype=torch.int32), tiles)
    ready.ready[int(ns) - 1] = tiles - 1  # the last used slot lacks one tile
    act = torch.randn(slots, m, inter).bfloat16()
    monkeypatch.setattr(moe, "DOWN_WAIT_POLLS", 3)
    terms = torch.full((m, k + 1, h), float("nan"), dtype=torch.bfloat16)
    moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s, pos, terms,
             torch.empty(m, h, dtype=torch.bfloat16), ready=ready)
    assert moe.slot_wait_failed(ready.failed) and not ready.ready.any()


def test_moe_slot_waits_refuse_what_cannot_count():
    """Slot counters for another tile count, for gate/up's split K without its tail (the
    SwiGLU kernel after it stores the activations) or for a gate/up that routes, and down's
    waits where gate/up writes the slot table (moe.Routing): refused by name."""
    m = 2
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    mw, sh = lw.mlp, lw.mlp.shared
    e, k, h = CFG.n_routed_experts, CFG.num_experts_per_tok, CFG.hidden_size
    slots, inter = m * k + 1, mw.gate.q.shape[1]
    block_n, _, split_k = moe.gate_up_tiling(m)
    assert split_k > 1
    tiles = -(-inter // block_n)
    xq, sx = quant_act(torch.randn(m, h).bfloat16())
    ns = torch.ones(1, dtype=torch.int32)
    se = torch.zeros(slots, dtype=torch.int32)
    act = torch.zeros(slots, m, inter, dtype=torch.bfloat16)
    parts = torch.zeros(split_k, slots, m, 2, inter)
    args = (xq, sx.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s, sh.gate.q,
            sh.gate.s, sh.up.q, sh.up.s, act, parts)
    ok = moe.SlotWait(torch.zeros(slots, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                      tiles)
    with pytest.raises(ValueError, match="SwiGLU tail"):
        moe.gate_up(*args, ready=ok)
    with pytest.raises(ValueError, match="tiles"):
        moe.gate_up(*args, arrivals=torch.zeros(tiles * slots, dtype=torch.int32),
                    ready=ok._replace(tiles=tiles + 1))
    sw, sr = torch.zeros(slots, m), torch.zeros(slots, m, dtype=torch.int32)
    routing = moe.Routing(torch.zeros(2, m, e), mw.bias, torch.zeros(m, dtype=torch.int64), k,
                          2.5, True, sw, sr)
    with pytest.raises(ValueError, match="writes its own"):
        moe.gate_up(*args, arrivals=torch.zeros(tiles * slots, dtype=torch.int32), ready=ok,
                    route=routing)
    with pytest.raises(ValueError, match="route must have written"):
        moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s,
                 torch.zeros(m, dtype=torch.int64), torch.zeros(m, k + 1, h).bfloat16(),
                 torch.zeros(m, h).bfloat16(), table_early=False, ready=ok)


def test_gate_up_refuses_routing_of_another_shape():
    """moe.Routing's partials must be the step's [split, rows, experts]: refused by name."""
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    mw, sh = lw.mlp, lw.mlp.shared
    m, e, k, h = 2, CFG.n_routed_experts, CFG.num_experts_per_tok, CFG.hidden_size
    slots, inter = m * k + 1, mw.gate.q.shape[1]
    ns = torch.ones(1, dtype=torch.int32)
    se = torch.zeros(slots, dtype=torch.int32)
    sw, sr = torch.zeros(slots, m), torch.zeros(slots, m, dtype=torch.int32)
    act = torch.zeros(slots, m, inter, dtype=torch.bfloat16)
    routing = moe.Routing(torch.zeros(2, m + 1, e), mw.bias, torch.zeros(m, dtype=torch.int64),
                          k, 2.5, True, sw, sr)
    xq, sx = quant_act(torch.randn(m, h).bfloat16())
    split_k = moe.gate_up_tiling(m)[2]
    gu_parts = torch.zeros(split_k, slots, m, 2, inter) if split_k > 1 else None
    with pytest.raises(ValueError, match="routing needs a MoE's router partials"):
        moe.gate_up(xq, sx.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s,
                    sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act, gu_parts, route=routing)


def _route_gate_up_down(mw, x, pos):
    """(act, out) of route, gate/up and down at x's rows on NaN-poisoned buffers."""
    m = x.shape[0]
    e, k, h = CFG.n_routed_experts, CFG.num_experts_per_tok, CFG.hidden_size
    slots, inter, sh = m * k + 1, mw.gate.q.shape[1], mw.shared
    parts = torch.full((2, m, e), float("nan"))
    se = torch.full((slots,), -7, dtype=torch.int32)
    sw = torch.full((slots, m), float("nan"))
    sr = torch.full((slots, m), -7, dtype=torch.int32)
    ns = torch.zeros(1, dtype=torch.int32)
    bf16_linear.bf16_linear_splitk(x, mw.router, parts)
    moe.route(parts, mw.bias, pos, k, CFG.routed_scaling_factor, True, se, sw, sr, ns)
    block_n, _, split_k = moe.gate_up_tiling(m)
    act = torch.full((slots, m, inter), float("nan"), dtype=torch.bfloat16)
    gu_parts = torch.full((split_k, slots, m, 2, inter), float("nan")) if split_k > 1 else None
    xq, sx = quant_act(x)
    moe.gate_up(xq, sx.contiguous(), e, se, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s,
                sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act, gu_parts,
                arrivals=torch.zeros(-(-inter // block_n) * slots, dtype=torch.int32))
    out = torch.full((m, h), float("nan"), dtype=torch.bfloat16)
    terms = torch.full((m, k + 1, h), float("nan"), dtype=torch.bfloat16)
    moe.down(act, e, se, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s, pos, terms, out)
    return act[: int(ns)].float(), out.float()


def test_expert_kernels_refuse_a_slot_table_shorter_than_their_grid():
    """gate/up and down ask for every program's slot-table entry together with the slot count
    (moe._slot_entry), so a table with fewer entries than the grid has slots is refused
    before the launch, by both."""
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    mw, sh = lw.mlp, lw.mlp.shared
    m, e, k, h = 2, CFG.n_routed_experts, CFG.num_experts_per_tok, CFG.hidden_size
    slots, inter = m * k + 1, mw.gate.q.shape[1]
    short = torch.zeros(slots - 1, dtype=torch.int32)
    ns = torch.ones(1, dtype=torch.int32)
    act = torch.zeros(slots, m, inter, dtype=torch.bfloat16)
    xq, sx = quant_act(torch.randn(m, h).bfloat16())
    split_k = moe.gate_up_tiling(m)[2]
    gu_parts = torch.zeros(split_k, slots, m, 2, inter) if split_k > 1 else None
    with pytest.raises(AssertionError, match="every program's slot needs a table entry"):
        moe.gate_up(xq, sx.contiguous(), e, short, ns, mw.gate.q, mw.gate.s, mw.up.q, mw.up.s,
                    sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act, gu_parts)
    sw = torch.zeros(slots, m)
    sr = torch.zeros(slots, m, dtype=torch.int32)
    with pytest.raises(AssertionError, match="every program's slot needs a table entry"):
        moe.down(act, e, short, sw, sr, ns, mw.down.q, mw.down.s, sh.down.q, sh.down.s,
                 torch.zeros(m, dtype=torch.int64), torch.zeros(m, k + 1, h, dtype=torch.bfloat16),
                 torch.zeros(m, h, dtype=torch.bfloat16))


@pytest.mark.parametrize("m", [1, 2])
def test_moe_without_tensor_cores_is_the_dot_form(m, monkeypatch):
    """gate/up and down without the tensor cores (moe.GEMV_MAX_ROWS, its own tilings) against
    the dot form and the torch reference: every activation and output written, activations
    within one bf16 step of the dot form's (fp32 sums in another order), outputs within the
    MoE test's bound of the reference. At 2 rows one is a pad row (no routed expert)."""
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    mw = lw.mlp
    g = torch.Generator().manual_seed(10 + m)
    x = torch.randn(m, CFG.hidden_size, generator=g).bfloat16()
    pos = torch.tensor([5, -1][:m])
    runs = []
    for gemv_rows in (0, m):
        monkeypatch.setattr(moe, "GEMV_MAX_ROWS", gemv_rows)
        monkeypatch.setattr(moe, "GATE_UP_GEMV_TILING", (16, 2, 2))
        monkeypatch.setattr(moe, "DOWN_GEMV_BLOCK", 16)
        runs.append(_route_gate_up_down(mw, x, pos))
    (act_dot, out_dot), (act_gemv, out_gemv) = runs
    assert not torch.isnan(act_gemv).any() and not torch.isnan(out_gemv).any()
    step = 2 ** -7 * act_dot.abs() + 1e-6
    assert bool(((act_gemv - act_dot).abs() <= step).all())
    ids, weights = router(CFG, mw, x)
    ref = moe_partial(CFG, mw, x, ids, weights, SGLANG)
    valid = pos >= 0
    assert _rel(out_gemv[valid], ref[valid]) <= 8 * BF16_ULP
    assert _rel(out_gemv, out_dot) <= 4 * BF16_ULP


@pytest.mark.parametrize("m, heads", [(1, 1), (3, 2)])
def test_indexer_prepare_by_head_blocks_is_bitwise_one_program_per_row(m, heads, monkeypatch):
    """indexer.prepare with `heads` query heads per program against one program per row (all
    heads): the same e4m3 queries, head weights and index-cache pages, a pad row writing no
    key."""
    from sgl_kernel_ext.triton import indexer
    from sglang.srt.layers.fused_decode.reference.cache import alloc_caches

    nh, d, lid = CFG.index_n_heads, CFG.index_head_dim, 0
    g = torch.Generator().manual_seed(m)
    kw_parts = torch.randn(2, m, d + nh, generator=g)
    q_parts = torch.randn(3, m, nh * d, generator=g)
    ln_w, ln_b = torch.rand(d, generator=g) + 0.5, torch.randn(d, generator=g) / 4
    pos = torch.tensor([5, -1, 9][:m])
    slots = torch.randperm(128, generator=g)[: m * 16].view(m, 16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, CFG.qk_rope_head_dim, 2) / CFG.qk_rope_head_dim))
    cache0 = alloc_caches(CFG, 128, "cpu", torch.bfloat16, layers=[lid]).index[lid]
    cache0.copy_(torch.randint(0, 256, cache0.shape, generator=g, dtype=torch.uint8))
    runs = []
    for hb in (nh, heads):
        monkeypatch.setattr(indexer, "PREPARE_HEADS", hb)
        cache = cache0.clone()
        q8 = torch.full((m, nh, d), 1.0).to(torch.float8_e4m3fn)
        head_w = torch.full((m, nh), float("nan"))
        indexer.prepare(kw_parts, q_parts, ln_w, ln_b, 1e-6, pos, slots, inv_freq, cache, q8,
                        head_w, CFG.qk_rope_head_dim)
        runs.append((q8.view(torch.uint8), head_w, cache))
    assert not torch.equal(runs[0][2], cache0)  # the valid rows' keys were written
    assert not torch.isnan(runs[1][1]).any()
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("m, split, merges", [(1, 2, False), (3, 8, False), (1, 4, True),
                                              (3, 2, True)])
def test_absorb_v_in_latent_chunks_is_the_one_chunk_product(m, split, merges, monkeypatch):
    """absorb_v over `split` latent chunks (fp32 partials, the last chunk's program summing
    and quantizing) against the attention chunks' merge kernel then one program per (head,
    128 outputs): e4m3 codes at most one step apart and rarely, every scale within 1e-5,
    every counter back at zero. With `merges` the chunk programs also merge the attention's
    chunks (one of them empty, l = 0, m = -inf), writing the same o_lat."""
    from sgl_kernel_ext.triton import mla

    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    kv_b = lw.attn.kv_b
    nope, v, c = CFG.qk_nope_head_dim, CFG.v_head_dim, CFG.kv_lora_rank
    nh = kv_b.shape[0] // (nope + v)
    g = torch.Generator().manual_seed(m * split)
    nsp = 4
    part_o = torch.randn(m, nsp, nh, c, generator=g)
    part_ml = torch.stack([torch.randn(m, nsp, nh, generator=g),
                           torch.rand(m, nsp, nh, generator=g) + 0.5], dim=-1)
    part_ml[0, nsp - 1, :, 0], part_ml[0, nsp - 1, :, 1] = float("-inf"), 0.0
    monkeypatch.setattr(mla, "ABSORB_V_MERGE_MAX_ROWS", 16 if merges else 0)
    runs = []
    for chunks in (1, split):
        monkeypatch.setattr(mla, "ABSORB_V_SPLIT_C", chunks)
        olat = torch.full((m, nh, c), float("nan"), dtype=torch.bfloat16)
        oq = torch.full((m, nh * v), 1.0).to(torch.float8_e4m3fn)
        os_ = torch.full((m, nh * v // 128), float("nan"))
        parts = torch.full((split * m * nh * v,), float("nan"))
        arrivals = torch.zeros(nh * (v // 128), dtype=torch.int32)
        if not mla.absorb_v_merges(parts, arrivals, m):
            mla._combine_kernel[(m, nh)](part_o, part_ml, olat, nh, nsp, C=c, BLOCK_S=nsp,
                                         PDL=False)
        mla.absorb_v(olat, kv_b, oq, os_, nope, v, parts, arrivals, (part_o, part_ml))
        assert not arrivals.any()
        runs.append((oq.view(torch.uint8).int(), os_, olat))
    assert not torch.isnan(runs[1][1]).any() and not torch.isnan(runs[1][2].float()).any()
    torch.testing.assert_close(runs[1][1], runs[0][1], rtol=1e-5, atol=0)
    assert torch.equal(runs[1][2], runs[0][2])
    # e4m3 codes: at most one step apart where the fp32 order moved a value across a
    # rounding boundary, and that rarely
    step = (runs[1][0] - runs[0][0]).abs()
    assert int(step.max()) <= 1 and float((step > 0).float().mean()) <= 0.01


def _absorb_runs(m, seed, settings, monkeypatch):
    """absorb of 3 random q_b partials at m rows once per dict of mla knob settings: (the
    qcat of each run as fp32, every element written; q_lat's bound check against the torch
    product q_nope . w_kc within one bf16 step, q_nope's bf16 rounding included)."""
    from sgl_kernel_ext.triton import mla

    kv_b = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1).attn.kv_b
    nope, rope, v, c = (CFG.qk_nope_head_dim, CFG.qk_rope_head_dim, CFG.v_head_dim,
                        CFG.kv_lora_rank)
    nh = kv_b.shape[0] // (nope + v)
    g = torch.Generator().manual_seed(seed)
    q_parts = torch.randn(3, m, nh * (nope + rope), generator=g)
    pos = torch.tensor([7, 300, 5, 2100][:m])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rope, 2) / rope))
    runs = []
    for knobs in settings:
        for name, value in knobs.items():
            monkeypatch.setattr(mla, name, value)
        qcat = torch.full((m, nh, c + rope), float("nan"), dtype=torch.bfloat16)
        mla.absorb(q_parts, kv_b, pos, inv_freq, qcat, nope, rope, v)
        assert not torch.isnan(qcat.float()).any()
        runs.append(qcat.float())
    q = q_parts[0] + q_parts[1] + q_parts[2]  # in the kernels' order
    q_nope = q.view(m, nh, nope + rope)[..., :nope].bfloat16().float()
    w_kc = kv_b.view(nh, nope + v, c)[:, :nope].float()
    want = torch.einsum("mhd,hdc->mhc", q_nope, w_kc)
    bound = 2 ** -8 * torch.einsum("mhd,hdc->mhc", q_nope.abs(), w_kc.abs()) + 2 ** -8 * want.abs()

    def near_product(qcat):
        return bool(((qcat[..., :c] - want).abs() <= bound + 1e-6).all())
    return runs, near_product, c


@pytest.mark.parametrize("m, block_c", [(1, 16), (2, 32)])
def test_absorb_without_tensor_cores_is_the_dot_form(m, block_c, monkeypatch):
    """absorb's GEMV form (w_kc in slices, no tl.dot) against its dot form and the torch
    product: q_pe bitwise the same, q_lat within one bf16 step of the dot form (fp32 sums in
    another order) and of q_nope . w_kc; every element of qcat written."""
    (dot, gemv), near_product, c = _absorb_runs(
        m, m, [{"ABSORB_GEMV_MAX_ROWS": rows, "ABSORB_GEMV_BLOCK_C": block_c}
               for rows in (0, m)], monkeypatch)
    assert torch.equal(gemv[..., c:], dot[..., c:])
    assert near_product(gemv) and near_product(dot)
    assert float((gemv[..., :c] != dot[..., :c]).float().mean()) <= 0.05


@pytest.mark.parametrize("m", [1, 4])  # the GEMV form, the dot form
def test_absorb_with_its_w_kc_tile_early_is_the_product(m, monkeypatch):
    """absorb with each program's whole w_kc tile loaded before the wait
    (mla.ABSORB_W_EARLY_MAX_ROWS) against the slices loaded after it (at 4 rows in 64-column
    slices): q_pe bitwise the same, q_lat within one bf16 step of q_nope . w_kc (fp32 sums
    in another order); every element of qcat written."""
    (late, early), near_product, c = _absorb_runs(
        m, 10 + m, [{"ABSORB_CHUNK_FROM_ROWS": 4, "ABSORB_W_EARLY_MAX_ROWS": rows}
                    for rows in (0, 16)], monkeypatch)
    assert torch.equal(early[..., c:], late[..., c:])
    assert near_product(early) and near_product(late)


# 2, 1, 1 or 2, and 1 loop steps a program (3: chunks of 1, 1 and 2 blocks of 32 entries)
@pytest.mark.parametrize("splits", [1, 2, 3, 4])
def test_attention_loading_ahead_is_bitwise_the_plain_loop(splits, monkeypatch):
    """The sparse attention with the next step's slots (ATTN_AHEAD 1) or also its KV rows (2)
    loaded before the step's math, and a program's first step's KV rows loaded before its
    wait (ATTN_PRELOAD_MAX_STEPS, here at any number of steps): the same bits as the plain
    loop, which matches the direct softmax over each row's selected cache rows (entries of -1
    skipped, a row with none zero), as do the latent in column tiles (ATTN_PARTS) and the
    score as independent chains (ATTN_QK_CHAINS); every element of the output written."""
    from sgl_kernel_ext.triton import mla

    c, r, nh, k, m, ctx = 64, 16, 4, 128, 3, 150
    g = torch.Generator().manual_seed(splits)
    kv_cache = torch.randn(400, c + r, generator=g).bfloat16()
    slots = torch.stack([torch.randperm(400, generator=g)[:ctx] for _ in range(m)]).int()
    topk = torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(m)]).int()
    topk[0, 5:70] = -1  # a step with a few entries, one with none
    topk[2] = -1  # a row that selects nothing
    qcat = torch.randn(m, nh, c + r, generator=g).bfloat16()
    runs = []
    forms = [(0, False, 1, 1), (1, False, 1, 1), (2, False, 1, 1), (1, True, 1, 1)]
    tiled = [(1, True, 4, 2), (2, False, 4, 1), (0, False, 1, 2)]
    monkeypatch.setattr(mla, "ATTN_PARTS_FROM_STEPS", 1)  # tiles at every step count here
    for ahead, preload, parts, chains in forms + tiled:
        monkeypatch.setattr(mla, "ATTN_AHEAD", ahead)
        monkeypatch.setattr(mla, "ATTN_PRELOAD_MAX_STEPS", 1 << 30 if preload else 0)
        monkeypatch.setattr(mla, "ATTN_PARTS", parts)
        monkeypatch.setattr(mla, "ATTN_QK_CHAINS", chains)
        part_o = torch.full((m, splits, nh, c), float("nan"))
        part_ml = torch.full((m, splits, nh, 2), float("nan"))
        olat = torch.full((m, nh, c), float("nan"), dtype=torch.bfloat16)
        mla.sparse_attention(qcat, kv_cache, topk, slots, 0.125, part_o, part_ml, olat, c, r)
        assert not torch.isnan(olat.float()).any()
        runs.append(olat)
    assert all(torch.equal(run, runs[0]) for run in runs[1:len(forms)])
    for row in range(m):
        sel = topk[row][topk[row] >= 0].long()
        if sel.numel() == 0:
            assert all(not run[row].float().any() for run in runs)
            continue
        keys = kv_cache[slots[row, sel].long()].float()
        z = qcat[row].float() @ keys.T * 0.125
        want = torch.softmax(z, -1) @ keys[:, :c]
        for run in [runs[0]] + runs[len(forms):]:
            torch.testing.assert_close(run[row].float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("parts, chains, preload", [(1, 1, True), (8, 2, True), (8, 1, False),
                                                    (4, 2, False)])
def test_attention_column_tiles_at_glm53_widths_match_the_softmax(parts, chains, preload,
                                                                    monkeypatch):
    """The attention at GLM-5.3's widths (latent 512, rope 64, a TP8 rank's 8 heads padded to
    16) in ATTN_PARTS column tiles of 64-512 columns, one or independent score chains, first
    step preloaded or not: each row the direct softmax over its selected cache rows."""
    from sgl_kernel_ext.triton import mla

    c, r, nh, k, m, ctx = 512, 64, 8, 256, 2, 600
    g = torch.Generator().manual_seed(parts * 10 + chains)
    kv_cache = torch.randn(1000, c + r, generator=g).bfloat16()
    slots = torch.stack([torch.randperm(1000, generator=g)[:ctx] for _ in range(m)]).int()
    topk = torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(m)]).int()
    topk[0, 10:90] = -1
    qcat = torch.randn(m, nh, c + r, generator=g).bfloat16()
    monkeypatch.setattr(mla, "ATTN_PARTS", parts)
    monkeypatch.setattr(mla, "ATTN_PARTS_FROM_STEPS", 1)
    monkeypatch.setattr(mla, "ATTN_QK_CHAINS", chains)
    monkeypatch.setattr(mla, "ATTN_PRELOAD_MAX_STEPS", 1 << 30 if preload else 0)
    part_o = torch.full((m, 2, nh, c), float("nan"))
    part_ml = torch.full((m, 2, nh, 2), float("nan"))
    olat = torch.full((m, nh, c), float("nan"), dtype=torch.bfloat16)
    mla.sparse_attention(qcat, kv_cache, topk, slots, 0.07, part_o, part_ml, olat, c, r)
    assert mla.attention_parts(c, 2) == parts
    for row in range(m):
        sel = topk[row][topk[row] >= 0].long()
        keys = kv_cache[slots[row, sel].long()].float()
        want = torch.softmax(qcat[row].float() @ keys.T * 0.07, -1) @ keys[:, :c]
        torch.testing.assert_close(olat[row].float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("k, block", [(16, 512), (256, 0)])  # 0: the default, one step a pass
def test_topk_radix_select_follows_sglang_semantics(k, block):
    g = torch.Generator().manual_seed(k)
    width = 3000
    scores = torch.randn(5, width, generator=g)
    scores[1, 100:400] = 0.5  # a block of ties straddling the threshold
    scores[2] = torch.randint(0, 5, (width,), generator=g).float()  # ties everywhere
    positions = torch.tensor([2999, 2500, 1000, 100, -1])  # the last a pad row
    seq = positions + 1
    in_ctx = torch.arange(width) < seq[:, None]
    masked = torch.where(in_ctx, scores, torch.full_like(scores, float("-inf")))
    out = torch.full((5, k), -7, dtype=torch.int64)
    topk_positions(masked, positions, k, out, block=block)
    assert torch.equal(out, ref_indexer.topk_positions(scores, seq, k))


@pytest.mark.parametrize("row_programs", [0, 1, 3], ids=["a_chunk_each", "one", "three"])
@pytest.mark.parametrize("skip_count", [False, True], ids=["count_pass", "no_count_pass"])
@pytest.mark.parametrize("sum_block", [1, 2, 32])
@pytest.mark.parametrize("k", [16, 300])
def test_split_topk_is_the_one_program_topk(k, sum_block, skip_count, row_programs,
                                            monkeypatch):
    """The split top-k (several programs per row, six launches) against SGLang's semantics, on
    rows of 4 chunks with ties across chunk borders, a row within its first chunk (a short
    context in a wide table), a row within k and a pad row, +inf past each context (read, it
    would be picked); its
    programs loading the chunks' histograms and counts sum_block at a time
    (topk.SPLIT_SUM_BLOCK; 2: a block and a partial one); without the count pass
    (topk.SKIP_COUNT_PASS: five launches); row_programs: that many programs a row looping
    over its chunks (topk.SPLIT_MAX_PROGRAMS; three: the first takes chunks 0 and 3)."""
    from sgl_kernel_ext.triton import topk
    from sgl_kernel_ext.triton.topk import SPLIT_CHUNK, split_chunks, topk_positions_split

    monkeypatch.setattr(topk, "SPLIT_SUM_BLOCK", sum_block)
    monkeypatch.setattr(topk, "SKIP_COUNT_PASS", skip_count)
    if row_programs:
        monkeypatch.setattr(topk, "SPLIT_MAX_PROGRAMS", 6 * row_programs)

    g = torch.Generator().manual_seed(k + 1)
    width = 3 * SPLIT_CHUNK + 700
    scores = torch.randn(6, width, generator=g)
    tied = slice(2 * SPLIT_CHUNK - 200, 2 * SPLIT_CHUNK + 300)
    scores[1, tied] = 2.5  # ties straddling a chunk border (and a SPLIT_SUM_BLOCK = 2 border)
    scores[2] = torch.randint(0, 4, (width,), generator=g).float()  # ties everywhere
    positions = torch.tensor([width - 1, width - 10, width - 500, k // 2, -1, 1500])
    seq = positions + 1
    in_ctx = torch.arange(width) < seq[:, None]
    masked = torch.where(in_ctx, scores, torch.full_like(scores, float("inf")))
    p = split_chunks(width)
    assert p == 4 and topk.split_programs(6, width) == (row_programs or p)
    hist = torch.full((2, 6 * p * 256), -9, dtype=torch.int32)
    state = torch.full((2, 6 * 2), -9, dtype=torch.int32)
    counts = torch.full((6 * p * 2,), -9, dtype=torch.int32)
    out = torch.full((6, k), -7, dtype=torch.int64)
    topk_positions_split(masked, positions, k, out, hist, state, counts)
    want = ref_indexer.topk_positions(scores, seq, k)
    assert torch.equal(out, want)
    if k == 300:  # the k-th score is the tie, taken from both sides of the border
        taken = ((want[1] >= tied.start) & (want[1] < tied.stop)).sum()
        assert 200 < taken < 500, taken


def _index_inputs(g, m, nh, d, pages):
    """A random FP8 index cache (pages of 64 keys, then their fp32 scales), e4m3 queries
    and head weights."""
    keys = torch.randn(pages, 64, d, generator=g).to(torch.float8_e4m3fn)
    sk = torch.rand(pages, 64, generator=g) + 0.5
    cache = torch.cat([keys.view(torch.uint8).reshape(pages, -1),
                       sk.view(torch.uint8).reshape(pages, -1)], dim=1).contiguous()
    q8 = torch.randn(m, nh, d, generator=g).to(torch.float8_e4m3fn)
    return cache, q8, torch.randn(m, nh, generator=g)


@pytest.mark.parametrize("programs", [0, 3, -2], ids=["a_block_each", "looping", "launch_cap"])
@pytest.mark.parametrize("swap", [False, True], ids=["q_keys", "keys_q"])
@pytest.mark.parametrize("block_l", [32, 128, 256])
def test_index_scores_do_not_depend_on_the_block(block_l, swap, programs, monkeypatch):
    """indexer.scores with block_l positions a program (tiling_probe's score_block_*) against
    the default block and against the torch sum over heads of w * ReLU(q . k) * scale_k in
    each row's context; past it -inf to the end of the row's last block, nothing written
    after (a row of a short context in a wide table); swap: keys x q^T (indexer.SCORE_SWAP);
    programs: 3 programs a row looping over its blocks (indexer.SCORE_MAX_ROW_PROGRAMS), or
    -2: 2 a row from a cap on the launch's programs (indexer.score_row_programs)."""
    from sgl_kernel_ext.triton import indexer
    from sglang.srt.layers.fused_decode.testing import scores_past_context_as_documented

    monkeypatch.setattr(indexer, "SCORE_SWAP", swap)
    if programs > 0:
        monkeypatch.setattr(indexer, "SCORE_MAX_ROW_PROGRAMS", programs)
    elif programs < 0:
        monkeypatch.setattr(indexer, "SCORE_MAX_PROGRAMS", 4 * -programs + 3)  # 4 rows
        monkeypatch.setattr(indexer, "SCORE_MIN_ROW_PROGRAMS", 1)
        assert indexer.score_row_programs(4) == -programs

    g = torch.Generator().manual_seed(block_l)
    m, nh, d, width, pages = 4, 4, 128, 300, 20
    cache, q8, head_w = _index_inputs(g, m, nh, d, pages)
    positions = torch.tensor([299, 150, -1, 20])
    slots = torch.randperm(pages * 64, generator=g)[: m * width].view(m, width)
    seq = positions + 1
    in_ctx = torch.arange(width) < seq[:, None]
    outs = []
    for block in (0, block_l):
        out = torch.full((m, width), 7.0)
        indexer.scores(q8, head_w, cache, positions, slots, out, block)
        assert scores_past_context_as_documented(out, seq, block or indexer.SCORE_BLOCK, 7.0)
        outs.append(out)
    assert torch.equal(outs[0][in_ctx], outs[1][in_ctx])
    # the same slots read in place from a wider int32 pool table (runtime.step_rows' form)
    pool = torch.randint(0, pages * 64, (2 * m, width + 5), generator=g).to(torch.int32)
    rows = torch.randperm(2 * m, generator=g)[:m]
    pool[rows, :width] = slots.to(torch.int32)
    out = torch.full((m, width), 7.0)
    indexer.scores(q8, head_w, cache, positions, pool[:, :width], out, block_l, slot_rows=rows)
    assert torch.equal(out, outs[1])
    keys = cache[:, :64 * d].contiguous().view(torch.float8_e4m3fn).float().view(-1, d)
    sk = cache[:, 64 * d:].contiguous().view(torch.float32).reshape(-1)
    dots = torch.einsum("mhd,mld->mhl", q8.float(), keys[slots]).clamp_min(0)
    want = (dots * head_w[:, :, None]).sum(1) * sk[slots]
    assert torch.allclose(outs[1][in_ctx], want[in_ctx], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("programs", [0, 2], ids=["a_block_each", "looping"])
def test_index_scores_skip_rows_within_the_top_k(programs, monkeypatch):
    """indexer.scores(skip_within=k): rows of contexts of k positions or fewer (which the top-k
    takes whole) write nothing, the others what the plain launch writes, bitwise; a row of
    exactly k positions is skipped, one of k + 1 is not."""
    from sgl_kernel_ext.triton import indexer

    if programs:
        monkeypatch.setattr(indexer, "SCORE_MAX_ROW_PROGRAMS", programs)
    g = torch.Generator().manual_seed(3 + programs)
    m, nh, d, width, pages, k = 4, 4, 128, 300, 20, 150
    cache, q8, head_w = _index_inputs(g, m, nh, d, pages)
    positions = torch.tensor([299, 149, 150, 20])  # contexts 300, 150 (= k), 151, 21
    slots = torch.randperm(pages * 64, generator=g)[: m * width].view(m, width)
    plain = torch.full((m, width), 7.0)
    indexer.scores(q8, head_w, cache, positions, slots, plain)
    out = torch.full((m, width), 7.0)
    indexer.scores(q8, head_w, cache, positions, slots, out, skip_within=k)
    scored = positions + 1 > k
    assert scored.tolist() == [True, False, True, False]
    assert torch.equal(out[scored], plain[scored])
    assert bool((out[~scored] == 7.0).all())


@pytest.mark.parametrize("programs", [0, 5], ids=["a_block_each", "looping"])
@pytest.mark.parametrize("k", [16, 300])
def test_scores_histogram_is_the_split_topks_first_pass(k, programs, monkeypatch):
    """indexer.scores with first_hist: each row's chunks' first-digit histograms (context
    positions only) against torch's, the scores bitwise the plain launch's; the split top-k
    from them (five launches) against SGLang's semantics and the six-launch split, and the
    histograms zero again after it. Rows: 3 chunks, within the second chunk, within k, pad;
    programs: 5 scores programs a row looping over its blocks (SCORE_MAX_ROW_PROGRAMS), and
    2 top-k programs a row over its 3 chunks (topk.SPLIT_MAX_PROGRAMS: the histograms' clear
    loops too)."""
    from sgl_kernel_ext.triton import indexer
    from sgl_kernel_ext.triton import topk as topk_kernel

    if programs:
        monkeypatch.setattr(indexer, "SCORE_MAX_ROW_PROGRAMS", programs)
        monkeypatch.setattr(topk_kernel, "SPLIT_MAX_PROGRAMS", 8)
    from sgl_kernel_ext.triton.topk import SPLIT_CHUNK, split_chunks, topk_positions_split
    from sglang.srt.layers.fused_decode.testing import first_digit_histograms

    g = torch.Generator().manual_seed(k + 5)
    m, nh, d, pages = 4, 4, 128, 80
    width = 2 * SPLIT_CHUNK + 300
    cache, q8, head_w = _index_inputs(g, m, nh, d, pages)
    positions = torch.tensor([width - 1, SPLIT_CHUNK + 1000, k // 2, -1])
    seq = positions + 1
    slots = torch.randint(0, pages * 64, (m, width), generator=g)
    p = split_chunks(width)
    plain = torch.full((m, width), 7.0)
    indexer.scores(q8, head_w, cache, positions, slots, plain)
    out = torch.full((m, width), 7.0)
    first_hist = torch.zeros(m * p * 256, dtype=torch.int32)
    indexer.scores(q8, head_w, cache, positions, slots, out, first_hist=first_hist)
    assert torch.equal(out, plain)
    in_ctx = torch.arange(width) < seq[:, None]
    assert bool(out[in_ctx].isfinite().all())  # the test's inputs are needed
    assert torch.equal(first_hist.view(m, p, 256),
                       first_digit_histograms(out, seq, SPLIT_CHUNK))

    i32 = dict(dtype=torch.int32)
    topks = []
    for fh in (first_hist, None):
        topk = torch.full((m, k), -7, dtype=torch.int64)
        topk_positions_split(out, positions, k, topk, torch.full((2, m * p * 256), -9, **i32),
                             torch.full((2, m * 2), -9, **i32), torch.full((m * p * 2,), -9, **i32),
                             first_hist=fh)
        topks.append(topk)
    assert torch.equal(topks[0], ref_indexer.topk_positions(out, seq, k))
    assert torch.equal(topks[0], topks[1])
    assert not first_hist.any()


@pytest.mark.parametrize("k", [16, 300])
def test_one_launch_topk_of_one_chunk_a_row(k):
    """The one-launch split top-k where a row is one chunk (its row barriers then wait only
    for the program itself, so the interpreter, which runs programs one after another, can
    run it): its histograms, digits and per-chunk counts against SGLang's semantics, with
    ties, a row within k and a pad row; counters left at zero. Several chunks a row: the
    GPU test test_one_launch_topk_equals_reference."""
    from sgl_kernel_ext.triton.topk import ONE_LAUNCH_MAX_CHUNK, split_chunks, topk_one_launch

    g = torch.Generator().manual_seed(k + 3)
    width = ONE_LAUNCH_MAX_CHUNK - 96
    scores = torch.randn(4, width, generator=g)
    scores[1] = torch.randint(0, 4, (width,), generator=g).float()  # ties everywhere
    positions = torch.tensor([width - 1, width - 10, k // 2, -1])
    seq = positions + 1
    in_ctx = torch.arange(width) < seq[:, None]
    masked = torch.where(in_ctx, scores, torch.full_like(scores, float("-inf")))
    hist = torch.full((2, 4 * split_chunks(width) * 256), -9, dtype=torch.int32)
    barriers = torch.zeros(8, dtype=torch.int32)
    out = torch.full((4, k), -7, dtype=torch.int64)
    topk_one_launch(masked, positions, k, out, hist, barriers, ONE_LAUNCH_MAX_CHUNK)
    assert torch.equal(out, ref_indexer.topk_positions(scores, seq, k))
    assert not barriers.any()


@pytest.mark.parametrize(
    "layer_id, contexts",
    [(0, [30, 0, 12, 40]), (1, [30, 0, 12, 40]), (2, [30, 0, 12, 40]), (1, [40, 9])],
    ids=["dense_indexer", "moe_indexer", "moe_shared", "moe_two_rows_split_k"],
)
@pytest.mark.parametrize("persistent", [True, False], ids=["one_launch", "stage_kernels"])
def test_fused_layer_matches_reference(layer_id, contexts, persistent):
    case = make_case(CFG, layer_id, contexts, seed=layer_id, tp_size=2)

    def build(cfg, lw, caches, rows, context):
        return FusedLayer(cfg, lw, caches, rows, context, persistent_launch=persistent)

    r = compare_with_reference(case, build)
    tol = NUMERICS["fused_layer_interpreter"]
    assert not r["y_nan"] and r["kv_untouched_bitwise"], r
    assert r["y_rel"] <= tol["y_rel"] and r["residual_rel"] <= tol["residual_rel"], r
    assert r["kv_written_rel"] <= tol["kv_written_rel"], r
    assert r["topk_overlap"] >= tol["topk_overlap"], r
    assert r["routing_flips"] <= tol["max_routing_flips"], r
    assert r.get("index_untouched_pages_bitwise", True), r


@pytest.mark.parametrize("layer_id", [0, 1], ids=["dense_indexer", "moe_indexer"])
@pytest.mark.parametrize("knob", ["KW_IN_LATENT", "SCORE_SKIP_SHORT_ROWS"])
def test_indexer_launch_forms_are_bitwise_the_plain_ones(layer_id, knob, monkeypatch):
    """The indexer's bf16 [wk; weights_proj] GEMM as programs of the latent launch
    (mla.KW_IN_LATENT) and the index scores skipping rows the top-k takes whole
    (indexer.SCORE_SKIP_SHORT_ROWS), each against its off form on a step with rows longer
    and shorter than the top-k and a pad row: outputs, top-k and caches bitwise equal."""
    from sgl_kernel_ext.triton import indexer, mla

    module = mla if knob == "KW_IN_LATENT" else indexer
    contexts = [30, 0, CFG.index_topk, CFG.index_topk + 1]
    case = make_case(CFG, layer_id, contexts, seed=7 + layer_id, tp_size=2)
    runs = []
    for on in (False, True):
        monkeypatch.setattr(module, knob, on)
        caches = clone_caches(case.caches)
        layer = _stage_layer(CFG, case.lw, caches, len(contexts), max(contexts))
        out = layer(case.hidden, case.residual, case.batch, case.topk_prev)
        runs.append(([t.clone() for t in out], caches))
    (a, c_a), (b, c_b) = runs
    assert not torch.isnan(a[0].float()).any()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(c_a.kv[layer_id].view(torch.int16), c_b.kv[layer_id].view(torch.int16))
    assert torch.equal(c_a.index[layer_id], c_b.index[layer_id])


def test_layer_with_down_slot_waits_is_bitwise_the_whole_wait(monkeypatch):
    """A MoE layer step of 6 rows (a pad row among them) with down waiting per slot on
    gate/up's counters (moe.DOWN_SLOT_WAIT_FROM_ROWS) against down after all of gate/up:
    outputs and caches bitwise equal, the counters zeroed again, no wait given up."""
    from sgl_kernel_ext.triton import moe

    contexts = [30, 0, 12, 40, 7, 21]
    case = make_case(CFG, 2, contexts, seed=71, tp_size=2)
    runs = []
    for rows_from in (1 << 30, 5):
        monkeypatch.setattr(moe, "DOWN_SLOT_WAIT_FROM_ROWS", rows_from)
        caches = clone_caches(case.caches)
        layer = _stage_layer(CFG, case.lw, caches, len(contexts), max(contexts))
        out = layer(case.hidden, case.residual, case.batch, case.topk_prev)
        runs.append(([t.clone() for t in out], caches))
        assert not layer.buf["down_ready"].any() and not layer.health()
    (a, c_a), (b, c_b) = runs
    assert not torch.isnan(a[0].float()).any()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(c_a.kv[2].view(torch.int16), c_b.kv[2].view(torch.int16))


def _stage_layer(cfg, lw, caches, rows, context):
    return FusedLayer(cfg, lw, caches, rows, context, persistent_launch=False)


@pytest.mark.parametrize("layer_id, contexts", [(0, [30, 0, 12]), (2, [40, 9])],
                         ids=["dense_indexer_pad_row", "moe_shared"])
def test_tp2_rank_sums_its_attention_across_the_ranks(layer_id, contexts):
    """Rank 0 of a TP2 layer, its all-reduce adding rank 1's attention output, against the
    reference over both shards: the post-attention norm sees the whole sum."""
    r = compare_two_ranks(CFG, layer_id, contexts, 50 + layer_id, _stage_layer)
    tol = NUMERICS["fused_layer_interpreter"]
    assert r["reduce_calls"] == 1 and r["reduced_shape_ok"], r
    assert not r["y_nan"] and r["routing_flips"] <= tol["max_routing_flips"], r
    assert r["y_rel"] <= tol["y_rel"] and r["residual_rel"] <= tol["residual_rel"], r


@pytest.mark.parametrize("layer_id", [0, 2], ids=["dense_indexer", "moe_shared"])
def test_shard_attention_rows_are_bitwise_the_partials(layer_id, monkeypatch):
    """A TP shard's o_proj summing each column tile into bf16 rows (the all-reduce's input;
    here none: one rank alone) against the norm summing o_proj's split-K partials itself
    (the one-rank form): outputs and cache bytes equal, o_proj's counters back at zero."""
    from sgl_kernel_ext.triton import fp8_linear

    # one 128-column group a step, so o_proj's K of 2 heads x 256 splits in four
    monkeypatch.setattr(fp8_linear, "tiling", lambda n, k: (64, 1, max(1, k // 128)))
    case = make_case(CFG, layer_id, [30, 0, 12], seed=60 + layer_id, tp_size=2)
    r = shard_rows_checks(case, 4, persistent_launch=False)
    assert all(r.values()), r


def test_absorb_lets_the_attention_launch_early_only_where_its_early_reads_are_done(
        monkeypatch):
    """mla.absorb_early_dependents: from its rows bound, never with the indexer (its top-k is
    absorb's predecessor) nor where the step's KV rows come from q_b's launch or attn_side's;
    and the layer asks for it in a layer reusing the top-k only (layer 2 here), its output
    the late launch's (the interpreter runs no programmatic launch: the wiring only)."""
    from sgl_kernel_ext.triton import mla

    monkeypatch.setattr(mla, "ABSORB_EARLY_DEPENDENTS_FROM_ROWS", 3)
    early = mla.absorb_early_dependents
    assert early(3, False, True) and early(16, False, True)
    assert not early(2, False, True)
    assert not early(16, True, True)
    assert not early(16, False, False)
    asked, absorb = [], mla.absorb

    def spy(*args, **kwargs):
        asked.append(kwargs["early_dependents"])
        return absorb(*args, **kwargs)

    monkeypatch.setattr(mla, "absorb", spy)
    outs = []
    for layer_id, from_rows in ((1, 3), (2, 3), (2, 0)):
        monkeypatch.setattr(mla, "ABSORB_EARLY_DEPENDENTS_FROM_ROWS", from_rows)
        case = make_case(CFG, layer_id, [30, 12, 40], seed=layer_id, tp_size=2)
        layer = FusedLayer(CFG, case.lw, case.caches, 3, case.batch.token_slots.shape[1],
                           persistent_launch=False)
        outs.append(layer(case.hidden, case.residual, case.batch, case.topk_prev)[0].clone())
    assert asked == [False, True, False]
    assert torch.equal(outs[1], outs[2])
    assert not early(16, False, True)  # the bound at 0: never


@pytest.mark.parametrize("layer_id, contexts", [(0, [30, 0, 40]), (2, [30, 0, 40]),
                                                (2, [25, 40])])
def test_norm_weights_before_the_wait_are_bitwise_in_the_layer(layer_id, contexts, monkeypatch):
    """norm.W_EARLY_MAX_ROWS and mla.LATENT_W_EARLY_MAX_ROWS in a whole layer (the first norm,
    the latent kernel's two norms and the post-attention norm), moe.ROUTE_CONSTS_EARLY
    (route's launch at 3 rows, gate/up routing at 2) and indexer.PREPARE_EARLY: every output,
    the KV cache and the index cache bitwise the forms loading them after the wait or the
    reductions."""
    from sgl_kernel_ext.triton import indexer, mla, moe, norm

    case = make_case(CFG, layer_id, contexts, seed=7 + layer_id, tp_size=2)
    rows = len(contexts)
    runs = []
    for early in (0, 16):
        monkeypatch.setattr(norm, "W_EARLY_MAX_ROWS", early)
        monkeypatch.setattr(mla, "LATENT_W_EARLY_MAX_ROWS", early)
        monkeypatch.setattr(moe, "ROUTE_CONSTS_EARLY", early > 0)
        monkeypatch.setattr(indexer, "PREPARE_EARLY", early > 0)
        caches = clone_caches(case.caches)
        layer = FusedLayer(CFG, case.lw, caches, rows, case.batch.token_slots.shape[1],
                           persistent_launch=False)
        outs = [t.clone() for t in layer(case.hidden, case.residual, case.batch,
                                         case.topk_prev)]
        runs.append((outs, caches))
    (a, ca), (b, cb) = runs
    assert torch.isfinite(a[0].float()).all()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ca.kv[layer_id].view(torch.int16), cb.kv[layer_id].view(torch.int16))
    if layer_id in ca.index:
        assert torch.equal(ca.index[layer_id], cb.index[layer_id])


def test_persistent_layer_refuses_a_tp_all_reduce():
    case = make_case(CFG, 2, [30, 12], seed=2, tp_size=2)
    layer = FusedLayer(CFG, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
                       persistent_launch=True)
    with pytest.raises(RuntimeError, match="no all-reduce inside its launch"):
        layer(case.hidden, case.residual, case.batch, case.topk_prev, reduce=lambda t: t)


@pytest.mark.parametrize("env", ["SGL_KERNEL_EXT_SM90_O_PROJ", "SGL_KERNEL_EXT_SM90_QKV_A",
                                 "SGL_KERNEL_EXT_SM90_MOE", "SGL_KERNEL_EXT_SM90_ATTN",
                                 "SGL_KERNEL_EXT_SM90_ATTN_SIDE"])
def test_sm90_linears_refuse_to_build_where_they_cannot_run(monkeypatch, env):
    """An sm90 opt-in names why a layer cannot take it (here: no CUDA device; with the
    persistent layer: that one runs no stage kernels), rather than falling back."""
    case = make_case(CFG, 2, [30, 12], seed=2, tp_size=1)
    monkeypatch.setenv(env, "1")
    with pytest.raises(ValueError, match=f"layer 2: {env}=1 needs a CUDA device"):
        FusedLayer(CFG, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
                   persistent_launch=False)
    monkeypatch.delenv(env)
    FusedLayer(CFG, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
               persistent_launch=False)


def _build_logging(case, caplog):
    """A layer of `case` built for 2 rows on the stage kernels, its build's INFO log in caplog
    (the layer's once-a-process messages cleared first)."""
    import logging

    from sglang.srt.layers.fused_decode import layer as layer_mod

    caplog.clear()
    layer_mod._log_once.cache_clear()
    with caplog.at_level(logging.INFO, logger=layer_mod.__name__):
        return FusedLayer(CFG, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
                          persistent_launch=False)


def test_sm90_attention_by_default_logs_why_it_runs_triton(monkeypatch, caplog):
    """Unset, SGL_KERNEL_EXT_SM90_ATTN takes sparse_mla wherever it can run; where it cannot
    (here: no CUDA device) the layer builds on Triton's attention and logs why; "0" is off."""
    from sgl_kernel_ext.nvidia import sm90

    case = make_case(CFG, 2, [30, 12], seed=2, tp_size=1)
    monkeypatch.delenv(sm90.ATTN_ENV, raising=False)
    assert _build_logging(case, caplog).sm90_attn is None
    assert "runs Triton's kernel: sm90 sparse_mla needs a CUDA device" in caplog.text
    monkeypatch.setenv(sm90.ATTN_ENV, "0")
    assert _build_logging(case, caplog).sm90_attn is None
    assert "Triton's kernel" not in caplog.text


def test_sm90_attn_side_by_default_logs_why_it_runs_the_stage_kernels(monkeypatch, caplog):
    """Unset, SGL_KERNEL_EXT_SM90_ATTN_SIDE takes attn_side's launch wherever it can run; where
    it cannot (here: no CUDA device) the layer builds on the stage kernels and logs why; "0" is
    off."""
    from sgl_kernel_ext.nvidia import sm90

    case = make_case(CFG, 2, [30, 12], seed=2, tp_size=1)
    monkeypatch.delenv(sm90.ATTN_SIDE_ENV, raising=False)
    layer = _build_logging(case, caplog)
    assert layer.attn_side is None and not layer.attn_side_work
    assert "run the stage kernels: sm90 attn_side needs a CUDA device" in caplog.text
    monkeypatch.setenv(sm90.ATTN_SIDE_ENV, "0")
    assert not _build_logging(case, caplog).attn_side_work
    assert "attn_side" not in caplog.text


def test_layer_calls_sparse_mla_as_it_is_declared(monkeypatch):
    """The layer's sparse_mla call binds to sparse_attention's signature (a knob removed
    from one and left in the other fails here, not first on the GPU)."""
    import inspect

    sparse_mla = pytest.importorskip("sgl_kernel_ext.nvidia.sm90.sparse_mla",
                                     reason="CuTe DSL (nvidia-cutlass-dsl) is not installed")
    declared = inspect.signature(sparse_mla.sparse_attention)
    calls = []

    class Reached(Exception):
        pass

    class Kernel:
        @staticmethod
        def sparse_attention(*args, **kwargs):
            calls.append(declared.bind(*args, **kwargs))
            raise Reached

    monkeypatch.setattr(FusedLayer, "_sm90_attention", lambda self, dev: Kernel)
    case = make_case(CFG, 2, [30, 12], seed=2, tp_size=1)
    layer = FusedLayer(CFG, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
                       persistent_launch=False)
    with pytest.raises(Reached):
        layer(case.hidden, case.residual, case.batch, case.topk_prev)
    from sgl_kernel_ext.nvidia import sm90

    assert len(calls) == 1 and calls[0].arguments["stages"] == sm90.ATTN_STAGES


def test_plan_of_persistent_tp_shards_refuses_to_build():
    """Serving refuses at load, not at the first step: a plan whose persistent layers are TP
    shards names them; the same shards on the stage kernels build."""
    import functools

    from sglang.srt.layers.fused_decode.plan import build_plan

    weights = [gen_layer(CFG, 0, lid, tp_size=2) for lid in (0, 2)]
    widths = {"decode": (1, 2)}
    with pytest.raises(ValueError, match=r"layers \[0, 2\] are TP shards"):
        build_plan(CFG, weights, widths, 64,
                   layer_cls=functools.partial(FusedLayer, persistent_launch=True))
    plan = build_plan(CFG, weights, widths, 64,
                      layer_cls=functools.partial(FusedLayer, persistent_launch=False))
    assert all(layer.sharded for layer in plan.layers)


def test_layer_built_for_more_rows_serves_fewer():
    """A layer is built once for its widest bucket and run with any row count up to it."""
    case = make_case(CFG, 1, [33], seed=9, tp_size=2)

    def wide(cfg, lw, caches, rows, context):
        return FusedLayer(cfg, lw, caches, 4, context)

    r = compare_with_reference(case, wide)
    tol = NUMERICS["fused_layer_interpreter"]
    assert not r["y_nan"] and r["kv_untouched_bitwise"], r
    assert r["y_rel"] <= tol["y_rel"] and r["routing_flips"] <= tol["max_routing_flips"], r


@pytest.mark.parametrize("layer_id, contexts", [(2, [30, 0]), (2, [41]), (2, [12, 40]),
                                                (1, [12, 40])],
                         ids=["pad_row", "one_row", "two_rows", "indexer_layer_keeps_latent"])
def test_latent_in_q_b_matches_the_latent_kernel(layer_id, contexts, monkeypatch):
    """q_a|kv_a's tails summing each column tile, then q_b norming and quantizing c_q itself
    with one more program writing the KV-cache rows (mla.LATENT_IN_Q_B_MAX_ROWS), against the
    latent kernel: the same KV-cache bytes except a few values one bf16 step apart (c_kv's sum
    of squares is taken by tile), none for a pad row; the layer's output within 1% and its
    arrival counters back at zero. A layer with the indexer keeps the latent kernel."""
    from sgl_kernel_ext.triton import mla

    case = make_case(CFG, layer_id, contexts, seed=30 + layer_id, tp_size=2)
    calls = []
    original = mla.q_b_normed
    monkeypatch.setattr(mla, "q_b_normed", lambda *a, **k: calls.append(1) or original(*a, **k))
    runs = []
    for rows in (len(contexts), 0):
        monkeypatch.setattr(mla, "LATENT_IN_Q_B_MAX_ROWS", rows)
        caches = clone_caches(case.caches)
        layer = FusedLayer(CFG, case.lw, caches, 2, case.batch.token_slots.shape[1],
                           persistent_launch=False)
        y = layer(case.hidden, case.residual, case.batch, case.topk_prev)[0].clone()
        assert not layer.buf["qkv_arrivals"].any()
        runs.append((y, caches.kv[layer_id]))
    assert len(calls) == (0 if CFG.runs_indexer(layer_id) else 1)
    (y_f, kv_f), (y_l, kv_l) = runs
    assert not torch.isnan(y_f.float()).any()
    assert float((y_f.float() - y_l.float()).abs().max() / y_l.float().abs().max()) <= 0.01
    diff = kv_f.view(torch.int16) != kv_l.view(torch.int16)
    written = [int(case.batch.token_slots[m, case.batch.positions[m]])
               for m in range(len(contexts)) if case.batch.positions[m] >= 0]
    assert set(diff.any(dim=1).nonzero().flatten().tolist()) <= set(written)
    assert float(diff[written].float().mean()) <= 0.05
    step = (kv_f.float() - kv_l.float()).abs() / kv_l.float().abs().clamp_min(1e-30)
    assert bool((step[diff] <= 2 ** -7).all())


@pytest.mark.parametrize("layer_id", [0, 2], ids=["dense_indexer", "moe_shared"])
def test_absorb_on_q_b_tail_rows_is_bitwise_the_partials(layer_id, monkeypatch):
    """absorb reading q as the bf16 rows q_b's last-arriving K chunks sum (fp8_linear tails
    without sums of squares, and none for the indexer's wq_b tiles of the same launch,
    mla.ABSORB_Q_ROWS_FROM) against absorb summing q_b's split-K partials: outputs, top-k
    and cache bytes equal, with a pad row among 3; q_b's counters back at zero."""
    from sgl_kernel_ext.triton import fp8_linear, mla

    # one 128-column group a step, so the tiny K of 256 splits in two
    monkeypatch.setattr(fp8_linear, "tiling", lambda n, k: (64, 1, max(1, k // 128)))
    case = make_case(CFG, layer_id, [30, 0, 12], seed=40 + layer_id, tp_size=2)
    seen = []
    original = mla.absorb
    monkeypatch.setattr(mla, "absorb", lambda q, *a, **k: seen.append((q.dtype, q.shape[0]))
                        or original(q, *a, **k))
    monkeypatch.setattr(mla, "Q_FIXED_FROM_ROWS", 0)  # the tails' form, not the sums'
    runs = []
    for first in (1 << 30, 1):
        monkeypatch.setattr(mla, "ABSORB_Q_ROWS_FROM", first)
        caches = clone_caches(case.caches)
        layer = FusedLayer(CFG, case.lw, caches, 4, case.batch.token_slots.shape[1],
                           persistent_launch=False)
        assert layer.split_q_b > 1, "the case must split q_b's K for the tails to sum anything"
        outs = [t.clone() for t in layer(case.hidden, case.residual, case.batch, case.topk_prev)]
        assert not layer.buf["q_arrivals"].any()
        runs.append((outs, caches))
    assert seen == [(torch.float32, layer.split_q_b), (torch.bfloat16, 1)]
    (a_out, a_c), (b_out, b_c) = runs
    for x, y in zip(a_out, b_out):
        assert torch.equal(x, y)
    assert torch.equal(a_c.kv[layer_id].view(torch.int16), b_c.kv[layer_id].view(torch.int16))
    if layer_id in a_c.index:
        assert torch.equal(a_c.index[layer_id], b_c.index[layer_id])


def _stage_kernels_against_reference(case):
    """(compare_with_reference's metrics, the layer) for the stage kernels' layer of case."""
    layers = []

    def build(cfg, lw, caches, rows, context):
        layers.append(FusedLayer(cfg, lw, caches, rows, context, persistent_launch=False))
        return layers[-1]

    return compare_with_reference(case, build), layers[0]


def _assert_interpreter_numerics(r):
    tol = NUMERICS["fused_layer_interpreter"]
    assert not r["y_nan"] and r["y_rel"] <= tol["y_rel"], r
    assert r["residual_rel"] <= tol["residual_rel"] and r["routing_flips"] <= 1, r


def test_absorb_on_q_b_fixed_sums_matches_reference(monkeypatch):
    """absorb reading q_b's fixed-point sums (mla.Q_FIXED_FROM_ROWS, a layer without the
    indexer; from 1 row here) against the reference within numerics, with a pad row among 3:
    absorb handed the int64 sums, q_b no tails (its counters untouched), and the sums back
    at zero after the layer (absorb_v zeroes them), so a second call is bitwise the first."""
    from sgl_kernel_ext.triton import fp8_linear, mla

    monkeypatch.setattr(fp8_linear, "tiling", lambda n, k: (64, 1, max(1, k // 128)))
    monkeypatch.setattr(mla, "Q_FIXED_FROM_ROWS", 1)
    seen = []
    original = mla.absorb
    monkeypatch.setattr(mla, "absorb", lambda q, *a, **k: seen.append((q.dtype, q.shape[0]))
                        or original(q, *a, **k))
    case = make_case(CFG, 2, [30, 0, 12], seed=91, tp_size=2)
    r, layer = _stage_kernels_against_reference(case)
    assert not layer.runs_indexer and seen and all(q == (torch.int64, 1) for q in seen), seen
    assert not layer.buf["q_sums"].any() and not layer.buf["q_arrivals"].any()
    _assert_interpreter_numerics(r)
    caches = clone_caches(case.caches)
    again = FusedLayer(CFG, case.lw, caches, 3, case.batch.token_slots.shape[1],
                       persistent_launch=False)
    args = (case.hidden, case.residual, case.batch, case.topk_prev)
    first = [t.clone() for t in again(*args)]
    assert all(torch.equal(a, b) for a, b in zip(again(*args), first))


@pytest.mark.parametrize("layer_id", [1, 2], ids=["moe_indexer", "moe_shared"])
def test_q_b_split_with_tail_rows(layer_id, monkeypatch):
    """q_b in fewer K chunks where its tails sum absorb's rows (mla.Q_B_SPLIT_WITH_ROWS), in a
    layer without the indexer only (with it, wq_b shares the launch and q_index's split): the
    layer against the reference within numerics, q_b's counters back at zero."""
    from sgl_kernel_ext.triton import fp8_linear, mla

    monkeypatch.setattr(fp8_linear, "tiling", lambda n, k: (64, 1, max(1, k // 128)))
    monkeypatch.setattr(mla, "Q_B_SPLIT_WITH_ROWS", 1)
    monkeypatch.setattr(mla, "ABSORB_Q_ROWS_FROM", 1)
    monkeypatch.setattr(mla, "Q_FIXED_FROM_ROWS", 0)
    splits = []
    original = fp8_linear.fp8_linear
    monkeypatch.setattr(fp8_linear, "fp8_linear", lambda xq, sx, wq, ws, parts, *a, **k: (
        splits.append((wq.shape[0], parts.shape[0])), original(xq, sx, wq, ws, parts, *a, **k)))
    case = make_case(CFG, layer_id, [30, 0, 12], seed=80 + layer_id, tp_size=2)
    r, layer = _stage_kernels_against_reference(case)
    q_b_split = dict(splits)[case.lw.attn.q_b.q.shape[0]]
    assert layer.split_q_b == 2 and q_b_split == (2 if layer.runs_indexer else 1), splits
    assert not layer.buf["q_arrivals"].any()
    _assert_interpreter_numerics(r)


@pytest.mark.parametrize("layer_id", [0, 1, 2], ids=["dense_indexer", "moe_indexer", "moe_shared"])
def test_persistent_layer_is_bitwise_the_stage_kernels(layer_id):
    """Under the interpreter both paths run the same task bodies with the same arithmetic:
    outputs, top-k and every cache byte equal, with the layer's counters back at zero."""
    case = make_case(CFG, layer_id, [30, 0, 12, 40], seed=3 + layer_id, tp_size=2)
    runs = []
    for persistent in (True, False):
        caches = clone_caches(case.caches)
        layer = FusedLayer(CFG, case.lw, caches, 4, case.batch.token_slots.shape[1],
                           persistent_launch=persistent)
        outs = [t.clone() for t in layer(case.hidden, case.residual, case.batch, case.topk_prev)]
        runs.append((outs, caches, layer.buf["counters"].clone()))
    (p_out, p_c, counters), (s_out, s_c, _) = runs
    for a, b in zip(p_out, s_out):
        assert torch.equal(a, b)
    assert torch.equal(p_c.kv[layer_id].view(torch.int16), s_c.kv[layer_id].view(torch.int16))
    if layer_id in p_c.index:
        assert torch.equal(p_c.index[layer_id], s_c.index[layer_id])
    assert not counters.any(), counters


@pytest.mark.parametrize("layer_id, contexts, persistent", [
    (0, [30, 0, 12, 40], False), (2, [30, 0, 12, 40], False), (2, [30, 41], False),
    (1, [30, 0, 12, 40], True)], ids=["dense_indexer", "moe_latent_kernel", "moe_latent_in_q_b",
                                      "moe_indexer_one_launch"])
def test_slots_read_from_a_pool_table_are_bitwise_a_table_a_row(layer_id, contexts, persistent,
                                                                monkeypatch):
    """The layer's slots read in place from a server's pool table (int32, wider than the
    step, each row's request at a shuffled row: runtime.step_rows' form) against the same
    step on a table a row: KV writes (latent, or q_b's extra program with
    mla.LATENT_IN_Q_B_MAX_ROWS at 2), the index cache and scores, the attention and the
    one-launch layer's tasks, bitwise."""
    from sgl_kernel_ext.triton import mla

    monkeypatch.setattr(mla, "LATENT_IN_Q_B_MAX_ROWS", 2)
    case = make_case(CFG, layer_id, contexts, seed=50 + layer_id, tp_size=2)
    checks = pool_table_checks(case, len(contexts), seed=layer_id,
                               persistent_launch=persistent)
    assert all(checks.values()), checks


def test_layer_with_split_topk_is_bitwise_the_one_program_topk(monkeypatch):
    """An indexer layer over a context wider than SPLIT_MIN_WIDTH: with the split top-k on,
    its first pass in the index scores or not (topk.SCORES_HISTOGRAM), with its count pass
    or not (topk.SKIP_COUNT_PASS), the same top-k, outputs and caches as with the
    one-program top-k; the scores' histograms back at zero."""
    from sgl_kernel_ext.triton import topk as topk_kernel

    case = make_case(CFG, 1, [topk_kernel.SPLIT_MIN_WIDTH + 900, 40], seed=21, tp_size=2)
    runs = []
    for split, in_scores, skip_count in (("1", False, False), ("1", True, False),
                                         ("1", True, True), ("0", False, False)):
        monkeypatch.setenv(topk_kernel.SPLIT_ENV, split)
        monkeypatch.setattr(topk_kernel, "SCORES_HISTOGRAM", in_scores)
        monkeypatch.setattr(topk_kernel, "SKIP_COUNT_PASS", skip_count)
        caches = clone_caches(case.caches)
        layer = FusedLayer(CFG, case.lw, caches, 2, case.batch.token_slots.shape[1],
                           persistent_launch=False)
        runs.append([t.clone() for t in layer(case.hidden, case.residual, case.batch,
                                              case.topk_prev)])
        assert ("topk_hist" in layer.buf) and topk_kernel.use_split(
            case.batch.token_slots.shape[1]) == (split == "1")
        assert not layer.buf["topk_first_hist"].any()
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a, b)


def test_a_layer_of_an_unfinalized_workspace_refuses_to_run():
    from sglang.srt.layers.fused_decode.workspace import Workspace

    case = make_case(CFG, 1, [30, 12], seed=2, tp_size=2)
    ws = Workspace("cpu")
    layer = FusedLayer(CFG, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
                       persistent_launch=False, workspace=ws)
    with pytest.raises(RuntimeError, match="not finalized"):
        layer(case.hidden, case.residual, case.batch, case.topk_prev)
    ws.finalize()
    with pytest.raises(RuntimeError, match="already finalized"):
        ws.request(layer, {})
    y, _, _ = layer(case.hidden, case.residual, case.batch, case.topk_prev)
    assert not torch.isnan(y[case.batch.valid].float()).any()


def test_layers_sharing_one_workspace_are_bitwise_their_own_buffers():
    """A stack of every tiny layer (dense and MoE, with and without the indexer) run as the
    runtime does (each layer's y is the next one's input), two steps, gives the same outputs
    and caches when the layers share one workspace as when each has its own buffers."""
    contexts = [30, 0, 12, 40]
    cases = [make_case(CFG, lid, contexts, seed=5, tp_size=2)
             for lid in range(CFG.num_hidden_layers)]
    (y0, r0, t0, c0), (y1, r1, t1, c1) = stack_with_and_without_workspace(cases)
    valid = cases[0].batch.valid
    assert not torch.isnan(y0[valid].float()).any()
    assert torch.equal(y0[valid], y1[valid]) and torch.equal(r0[valid], r1[valid])
    assert torch.equal(t0[valid], t1[valid])
    for lid in c0.kv:
        assert torch.equal(c0.kv[lid].view(torch.int16), c1.kv[lid].view(torch.int16))
    for lid in c0.index:
        assert torch.equal(c0.index[lid], c1.index[lid])


def test_workspace_zeroed_buffers_start_at_zero_and_must_agree(monkeypatch):
    """A zeroed spec (the scores' first-digit histograms) is allocated at zero even where
    uninitialized memory is not, shared at its largest request; layers asking for the same
    name zeroed and not are refused."""
    from types import SimpleNamespace

    from sglang.srt.layers.fused_decode.workspace import Spec, Workspace

    full = torch.full
    monkeypatch.setattr(torch, "empty", lambda shape, dtype=None, device=None:
                        full(shape, 7, dtype=dtype, device=device))
    a, b = SimpleNamespace(buf={}), SimpleNamespace(buf={})
    ws = Workspace("cpu")
    ws.request(a, {"h": Spec((4,), torch.int32, zeroed=True), "x": Spec((2,), torch.int32)})
    ws.request(b, {"h": Spec((8,), torch.int32, zeroed=True)})
    ws.finalize()
    assert torch.equal(b.buf["h"], torch.zeros(8, dtype=torch.int32))
    assert a.buf["h"].data_ptr() == b.buf["h"].data_ptr() and bool((a.buf["x"] == 7).all())
    clash = Workspace("cpu")
    clash.request(a, {"h": Spec((4,), torch.int32, zeroed=True)})
    clash.request(b, {"h": Spec((4,), torch.int32)})
    with pytest.raises(ValueError, match="zeroed"):
        clash.finalize()


def test_draft_iteration_attends_the_carried_topk():
    """The MTP draft's carried top-k (upstream's physical slots, shuffled) converted on the
    fly and attended by the indexer layer with its indexer skipped: the carry is the
    indexer's own top-k as ascending positions (a pad row none), no index key written, the
    same bits as attending those positions (the GPU test adds the CUDA graph)."""
    case = make_case(CFG, 0, [90, 70, 0, 40], seed=4, tp_size=2, paged=True)
    layer = FusedLayer(CFG, case.lw, case.caches, 4, case.batch.token_slots.shape[1])
    r = carried_topk_checks(case, layer)
    assert all(r.values()), r
