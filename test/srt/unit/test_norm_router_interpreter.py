"""The router on the un-normed post-attention row (``norm_router``) on CPU under Triton's
interpreter: the kernel against its algebra in torch, route's rstd factor against routing the
normed logits, and a MoE layer taking the form against the reference and against the
layer with its norm launch (the residual and the caches bitwise, the output within the
interpreter's NUMERICS). The GPU test: test/srt/kernels/test_fused_layer.py's
test_norm_free_router_matches_reference."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
    pytest.skip("GPU present: the kernels are tested in test/srt/kernels", allow_module_level=True)

from sgl_kernel_ext.triton import bf16_linear, moe, norm_router  # noqa: E402
from sglang.srt.layers.fused_decode.layer import FusedLayer  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import tiny_config  # noqa: E402
from sglang.srt.layers.fused_decode.spec import NUMERICS  # noqa: E402
from sglang.srt.layers.fused_decode.testing import (  # noqa: E402
    clone_caches,
    compare_with_reference,
    make_case,
)

CFG = tiny_config()
BF16_ULP = 2.0 ** -7  # the interpreter truncates bf16 casts where torch rounds


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def _route_outputs(rows, e, topk):
    """route's slot tables, poisoned, and its per-row scratch (counter at zero)."""
    slots = rows * topk + 1
    tables = (torch.full((slots,), -5, dtype=torch.int32), torch.full((slots, rows), float("nan")),
              torch.full((slots, rows), -5, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    scratch = (torch.zeros(rows * e, dtype=torch.int32), torch.zeros(rows * e),
               torch.zeros(1, dtype=torch.int32))
    return tables, scratch


@pytest.mark.parametrize("rows, block_n, split, in_tile", [
    (1, 16, 3, False), (2, 16, 2, False), (3, 16, 3, False), (5, 32, 1, False),
    (1, 16, 3, True), (2, 16, 2, True)])
def test_norm_router_is_its_algebra(rows, block_n, split, in_tile, monkeypatch):
    """parts = bf16((a + res) g) W^T by K chunk, ss the chunks' sums of squares of a + res,
    xq / sx the chunk's per-128 e4m3 of bf16((a + res) g) (one row at 1-2 rows, the MMA form
    from 3; at 1-2 rows also from tile 0's programs, QUANT_IN_PRODUCTS_MAX_ROWS): every
    element written, against torch; a and res left as they were."""
    monkeypatch.setattr(norm_router, "QUANT_IN_PRODUCTS_MAX_ROWS", 2 if in_tile else 0)
    monkeypatch.setattr(norm_router, "GEMV_SHAPE", (block_n, split))
    monkeypatch.setattr(norm_router, "MMA_SHAPE", (block_n, split))
    h, e = 384, 24  # 3 groups; 24 experts: a partial tile of 16 (or 32)
    g = torch.Generator().manual_seed(rows * 10 + split)
    a = torch.randn(rows, h, generator=g).bfloat16()
    res = torch.randn(rows, h, generator=g).bfloat16()
    gamma = (1.0 + 0.1 * torch.randn(h, generator=g)).bfloat16()
    w = (0.05 * torch.randn(e, h, generator=g)).bfloat16()
    a0, res0 = a.clone(), res.clone()
    parts = torch.full((split, rows, e), float("nan"))
    ss = torch.full((split, rows), float("nan"))
    xq = torch.full((rows + 2, h), float("nan")).to(torch.float8_e4m3fn)
    sx = torch.full((rows + 2, h // 128), float("nan"))
    norm_router.norm_router(a, res, gamma, w, parts, ss, xq, sx)
    assert torch.equal(a, a0) and torch.equal(res, res0)
    s = a.float() + res.float()
    y = (s * gamma.float()).bfloat16().float()
    assert torch.isfinite(parts).all() and torch.isfinite(ss).all()
    assert _rel(parts.sum(0), y @ w.float().T) <= 2 * BF16_ULP
    chunk = bf16_linear.chunk_cols(h, split)  # whole groups: the last chunk may be short
    for c in range(split):
        part = s[:, c * chunk:(c + 1) * chunk]
        assert torch.allclose(ss[c], (part * part).sum(1), rtol=1e-5)
    deq = xq[:rows].float().view(rows, h // 128, 128) * sx[:rows, :, None]
    assert torch.isfinite(deq).all()
    assert _rel(deq.view(rows, h), y) <= 2 ** -3  # e4m3: 3 mantissa bits
    amax = y.view(rows, h // 128, 128).abs().amax(-1)
    assert torch.allclose(sx[:rows], amax / 448.0, rtol=2 * BF16_ULP)
    assert torch.isnan(sx[rows:]).all()  # nothing past the rows


@pytest.mark.parametrize("rows", [3, 5])
def test_fixed_sums_are_the_partials_and_route_leaves_them_at_zero(rows, monkeypatch):
    """The MMA shape's products added into int64 sums (norm_router.fixed) equal its fp32 K
    chunks summed, within their rounding; route on those sums chooses and weighs as route on
    the chunks, and leaves the sums at zero for the next launch; the chunks' buffer is not
    written."""
    monkeypatch.setattr(norm_router, "MMA_SHAPE", (16, 3))
    h, e, topk, eps = 384, 24, 4, 1e-6
    g = torch.Generator().manual_seed(40 + rows)
    a = torch.randn(rows, h, generator=g).bfloat16()
    res = torch.randn(rows, h, generator=g).bfloat16()
    gamma = (1.0 + 0.1 * torch.randn(h, generator=g)).bfloat16()
    w = (0.05 * torch.randn(e, h, generator=g)).bfloat16()
    bias = 0.1 * torch.randn(e, generator=g)
    pos = torch.arange(rows, dtype=torch.int64) + 3
    bufs = []
    for fixed in (False, True):
        parts = torch.full((3, rows, e), float("nan"))
        ss = torch.full((3, rows), float("nan"))
        xq = torch.empty(rows, h, dtype=torch.float8_e4m3fn)
        sx = torch.empty(rows, h // 128)
        sums = torch.zeros(rows, e, dtype=torch.int64) if fixed else None
        norm_router.norm_router(a, res, gamma, w, parts, ss, xq, sx, sums=sums)
        if fixed:
            assert torch.isnan(parts).all()
            assert _rel(sums.double() * 2.0 ** -32, bufs[0][0].sum(0).double()) <= 1e-6
        tables, scratch = _route_outputs(rows, e, topk)
        moe.route(sums if fixed else parts, bias, pos, topk, 2.5, True, *tables, scratch,
                  ss=ss, hidden=h, eps=eps)
        if fixed:
            assert not sums.any()
        bufs.append((parts, tables))
    (_, (ex_a, w_a, r_a, n_a)), (_, (ex_b, w_b, r_b, n_b)) = bufs
    n = int(n_a)
    assert n == int(n_b) > 1
    assert torch.equal(ex_a[:n], ex_b[:n]) and torch.equal(r_a[:n], r_b[:n])
    assert torch.allclose(w_a[:n], w_b[:n], rtol=1e-5)


def test_fixed_sums_are_refused_where_gate_up_routes():
    """int64 sums at the GEMV shape's rows, or given to route's one-program form, are
    refused by name."""
    h, e = 256, 16
    a = torch.randn(2, h).bfloat16()
    split = norm_router.launch(2)[1]
    with pytest.raises(ValueError, match="sums must be contiguous int64"):
        norm_router.norm_router(a, a, torch.ones(h).bfloat16(), torch.randn(e, h).bfloat16(),
                                torch.empty(split, 2, e), torch.empty(split, 2),
                                torch.empty(2, h, dtype=torch.float8_e4m3fn),
                                torch.empty(2, h // 128), sums=torch.zeros(2, e, dtype=torch.int64))
    tables = (torch.zeros(9, dtype=torch.int32), torch.zeros(9, 2),
              torch.zeros(9, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="per-row form only"):
        moe.route(torch.zeros(2, e, dtype=torch.int64), torch.zeros(e),
                  torch.arange(2), 4, 2.5, True, *tables)


@pytest.mark.parametrize("rows", [1, 4])
def test_route_times_rstd_is_routing_the_normed_logits(rows):
    """route given the un-normed partials and their sums of squares chooses and weighs as
    route given the normed logits (rstd * the partials' sum) in one partial."""
    e, h, split, topk, eps = 32, 96, 3, 4, 1e-6
    g = torch.Generator().manual_seed(rows)
    parts = torch.randn(split, rows, e, generator=g) * 3.0
    ss = torch.rand(split, rows, generator=g) * h + 1.0
    bias = 0.1 * torch.randn(e, generator=g)
    pos = torch.arange(rows, dtype=torch.int64) + 5
    acc = ss[0] + ss[1] + ss[2]
    normed = ((parts[0] + parts[1] + parts[2]) * (1.0 / torch.sqrt(acc / h + eps))[:, None])
    outs = []
    for p, kw in ((parts, dict(ss=ss, hidden=h, eps=eps)), (normed[None].contiguous(), {})):
        tables, scratch = _route_outputs(rows, e, topk)
        moe.route(p, bias, pos, topk, 2.5, True, *tables, scratch, **kw)
        outs.append(tables)
    (ex_a, w_a, r_a, n_a), (ex_b, w_b, r_b, n_b) = outs
    n = int(n_a)
    assert n == int(n_b) > 1
    assert torch.equal(ex_a[:n], ex_b[:n]) and torch.equal(r_a[:n], r_b[:n])
    assert torch.allclose(w_a[:n], w_b[:n], rtol=1e-6)


@pytest.mark.parametrize(
    "layer_id, contexts, fixed_from, in_tile_rows",
    [(1, [30], 17, 0), (2, [40, 9], 17, 0), (1, [30, 0, 12, 40], 17, 0), (2, [30, 0, 12], 3, 0),
     (2, [40, 9], 17, 2)],
    ids=["moe_indexer_one_row", "moe_shared_two_rows", "moe_indexer_pad_row",
         "moe_shared_fixed_sums", "moe_shared_two_rows_quant_in_tile"],
)
def test_moe_layer_without_its_second_norm(layer_id, contexts, fixed_from, in_tile_rows,
                                           monkeypatch):
    """A MoE layer on a TP2 shard with the router on the un-normed row (gate/up routing at
    1-2 rows, route's launch at 3-4; at 3 rows also route reading fixed-point sums,
    norm_router.FIXED_FROM_ROWS): within the interpreter's NUMERICS of the reference, and
    against the layer with its norm launch the residual, the top-k and the caches bitwise
    (the attention side is the same), the output within the rounding the form changes, and
    the sums left at zero; at 2 rows also with the quantization in the products' programs
    (QUANT_IN_PRODUCTS_MAX_ROWS)."""
    monkeypatch.setattr(norm_router, "FIXED_FROM_ROWS", fixed_from)
    monkeypatch.setattr(norm_router, "QUANT_IN_PRODUCTS_MAX_ROWS", in_tile_rows)
    case = make_case(CFG, layer_id, contexts, seed=17 + layer_id, tp_size=2)
    rows, width = len(contexts), max(contexts)

    def build(cfg, lw, caches, n, w):
        return FusedLayer(cfg, lw, caches, n, w, persistent_launch=False)

    monkeypatch.setattr(norm_router, "ROWS", frozenset(range(1, 17)))
    r = compare_with_reference(case, build)
    tol = NUMERICS["fused_layer_interpreter"]
    assert not r["y_nan"] and r["kv_untouched_bitwise"], r
    assert r["y_rel"] <= tol["y_rel"] and r["residual_rel"] <= tol["residual_rel"], r
    assert r["routing_flips"] <= tol["max_routing_flips"], r

    runs = []
    for on in (frozenset(), frozenset(range(1, 17))):
        monkeypatch.setattr(norm_router, "ROWS", on)
        caches = clone_caches(case.caches)
        layer = build(CFG, case.lw, caches, rows, width)
        res = case.residual.clone()
        y, res_out, topk = layer(case.hidden, res, case.batch, case.topk_prev)
        assert not layer.buf["nr_sums"].any()
        runs.append((y.clone(), res_out.clone(), topk.clone(), caches))
    (y_a, res_a, t_a, c_a), (y_b, res_b, t_b, c_b) = runs
    assert torch.equal(res_a, res_b) and torch.equal(t_a, t_b)
    assert torch.equal(c_a.kv[layer_id].view(torch.int16), c_b.kv[layer_id].view(torch.int16))
    assert torch.isfinite(y_b.float()).all()
    assert _rel(y_b, y_a) <= tol["y_rel"]


def test_rows_from_the_environment_name_ranges_and_counts():
    assert norm_router._rows("") == frozenset()
    assert norm_router._rows("1-2") == {1, 2}
    assert norm_router._rows("1, 3-4,16") == {1, 3, 4, 16}
