"""The attention side's one launch so far (``sgl_kernel_ext.nvidia.sm90.attn_side``: q_a|kv_a,
then q_b on c_q normed and quantized inside q_b's units) against a float64 torch reference on
an H200: one GLM-5.3 TP8 rank's shapes at 1-16 rows, a small shape with fewer units than
workers, and a few CTAs taking many units each (the ring wrapping, units after units); outputs
and scratch poisoned with NaN before each launch and every element checked; no wait gave up;
the epoch moved on once a launch; 100 repeated launches and a CUDA-graph replay bitwise equal to
the first launch. The fixed form (c_q's chunks added as integers, no tails) likewise at 1-2
rows, its other parity's sums and counts poisoned before the first launch (it must zero them),
with the KV-cache rows it writes in place of kv_parts checked against the reference (every
other cache row untouched, nothing for a pad row).

Run on the GPU machine with CuTe DSL importable (benchmark/sm90_run.sh stages it).
"""

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a Hopper GPU (run on the lent H200)", allow_module_level=True)
pytest.importorskip("cutlass", reason="needs CuTe DSL (nvidia-cutlass-dsl): benchmark/sm90_run.sh")

from sgl_kernel_ext.nvidia.sm90 import attn_side as A  # noqa: E402
from sgl_kernel_ext.nvidia.sm90.fp8_mma import x_rows  # noqa: E402

# fp8_mma's bound (test_sm90_linear.TOL_MMA): wgmma sums a group's FP8 products at less than
# fp32 precision, |y - ref| <= 2^-11 sum_k |x_k w_k|
TOL_MMA = 2.0 ** -11
EPS = 1e-5


def make_case(m: int, shape: A.Shape, seed: int) -> dict:
    """Random FP8 weights with block scales, the layer's normed hidden quantized (rows past M
    NaN: they must not reach any output), gamma near 1."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nq, nkv, k1, nb = shape

    def weight(n, k):
        w = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
        return w, torch.rand(-(-n // 128), k // 128, device="cuda", generator=g) * 0.02 + 1e-3

    xq = torch.full((x_rows(m), k1), 0x7F, dtype=torch.uint8, device="cuda")
    xq = xq.view(torch.float8_e4m3fn)
    xq[:m] = (torch.randn(m, k1, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    sx = torch.rand(m, k1 // 128, device="cuda", generator=g) * 0.02 + 1e-3
    wq, wsq = weight(nq, k1)
    wkv, wskv = weight(nkv, k1)
    wb, wsb = weight(nb, nq)
    gamma = (1 + 0.3 * torch.randn(nq, device="cuda", generator=g)).to(torch.bfloat16)
    return dict(xq=xq, sx=sx, wq=wq, wsq=wsq, wkv=wkv, wskv=wskv, gamma=gamma, wb=wb, wsb=wsb)


WIDTH = 512  # positions a row's slot table holds


def make_kv(m: int, shape: A.Shape, seed: int, pad_last: bool) -> dict:
    """The fixed form's KV-row inputs: each row's slot table a random permutation of its own
    WIDTH cache rows (NaN: unwritten), a random position (-1 for a pad last row)."""
    g = torch.Generator(device="cuda").manual_seed(seed + 1000)
    c = shape.nkv - A.ROPE
    positions = torch.randint(0, WIDTH, (m,), device="cuda", generator=g)
    if pad_last:
        positions[-1] = -1
    slots = torch.stack([torch.randperm(WIDTH, device="cuda", generator=g) + WIDTH * i
                         for i in range(m)]).to(torch.int32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, A.ROPE, 2, device="cuda").float() / A.ROPE))
    return dict(kv_norm=(1 + 0.3 * torch.randn(c, device="cuda", generator=g)).to(torch.bfloat16),
                positions=positions, token_slots=slots, inv_freq=inv_freq,
                kv_cache=torch.full((m * WIDTH, shape.nkv), float("nan"), dtype=torch.bfloat16,
                                    device="cuda"))


def check_kv_rows(kv: dict, ref_kv, sc_kv, c: int):
    """Each real row's KV-cache row against the reference's (c_kv rounded to bf16, over its
    rms, times the weight; k_pe's pairs rotated in float64): within a bf16 step of the
    kernel's rounding plus fp8_mma's bound carried through; every other cache row NaN."""
    cache = kv["kv_cache"].double()
    written = torch.zeros(cache.shape[0], dtype=torch.bool, device="cuda")
    for r, pos in enumerate(kv["positions"].tolist()):
        if pos < 0:
            continue
        slot = int(kv["token_slots"][r, pos])
        written[slot] = True
        got = cache[slot]
        cb = ref_kv[r, :c].to(torch.bfloat16).double()
        rms = (cb.square().mean() + EPS).sqrt()
        ref_c = cb / rms * kv["kv_norm"].double()
        bound = 2.0 ** -7 * ref_c.abs() + 4 * TOL_MMA * sc_kv[r, :c] / rms * \
            kv["kv_norm"].double().abs() + 1e-6
        err = (got[:c] - ref_c).abs()
        assert (err <= bound).all(), f"row {r}: c_kv worst {(err / bound).max():.2f} of its bound"
        x = ref_kv[r, c:].to(torch.bfloat16).double()
        f = pos * kv["inv_freq"].double()
        x1, x2 = x[0::2], x[1::2]
        ref_pe = torch.stack((x1 * f.cos() - x2 * f.sin(), x2 * f.cos() + x1 * f.sin()), -1)
        ref_pe = ref_pe.flatten()
        sc = sc_kv[r, c:].view(-1, 2).sum(-1).repeat_interleave(2)
        err = (got[c:] - ref_pe).abs()
        bound = 2.0 ** -7 * ref_pe.abs() + 4 * TOL_MMA * sc + 2.0 ** -8 * x.abs().max() + 1e-6
        assert (err <= bound).all(), f"row {r}: k_pe worst {(err / bound).max():.2f} of its bound"
    assert cache[~written].isnan().all(), "a cache row written that no real row owns"


def _bits(t):
    """t's bits, so that poisoned (NaN) elements compare equal."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _deq(w, s):
    n, k = w.shape
    return w.double() * s.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)


def _chunks(x, w, split):
    """(x W^T by K chunk [split, M, N], sum |x w| likewise), float64."""
    m, k = x.shape
    n = w.shape[0]
    xc, wc = x.view(m, split, k // split), w.view(n, split, k // split)
    return (torch.einsum("msk,nsk->smn", xc, wc),
            torch.einsum("msk,nsk->smn", xc.abs(), wc.abs()))


def quant_128(y):
    """y [M, G, 128] (fp32) as e4m3 with one scale a row and group, as the launch quantizes:
    (e4m3 [M, G, 128], fp32 scales [M, G, 1]). The scale is amax / 448 correctly rounded, the
    launch's div.rn: torch's x / scalar on CUDA is x * fl(1/448), a last bit above it at
    times, which flips e4m3 ties (one step, ~0.1% of the elements; a K = 1024 row's c_q was
    once 2.86x over fp8_mma's bound for it)."""
    amax = y.abs().amax(-1, keepdim=True).clamp_min(1e-10)
    s = amax / torch.full_like(amax, 448.0)
    return (y * (1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn), s


def normed_quant(q_rows, gamma, nq):
    """c_q (the kernel's bf16 rows) normed, rounded to bf16 and quantized per 128 columns in
    fp32 as the kernel does it, but for the order of the sum of squares: the dequantized
    x [M, NQ], float64."""
    q = q_rows.float()
    rstd = torch.rsqrt((q * q).sum(-1, keepdim=True) / nq + EPS)
    y = ((q * rstd) * gamma.float()).to(torch.bfloat16).float().view(q.shape[0], -1, 128)
    xq, s = quant_128(y)
    return (xq.double() * s.double()).view(q.shape[0], nq)


def outputs(side: A.AttnSide, m: int, dev):
    nq, nkv, _, nb = side.shape
    return (torch.empty(side.split1, m, nkv, device=dev), torch.empty(m, nq, dtype=torch.bfloat16,
            device=dev), torch.empty(side.split2, m, nb, device=dev))


def _poison(*ts):
    for t in ts:
        t.fill_(float("nan"))


def _launch(case, outs, work, grid=0, pdl=True, kv=None):
    A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                case["gamma"], case["wb"], case["wsb"], *outs, work, eps=EPS, grid=grid, pdl=pdl,
                fixed=kv is not None, **(kv or {}))


def check(m: int, shape: A.Shape, seed: int, grid: int = 0, repeats: int = 100,
          fixed: bool = False, pad_last: bool = False):
    side, _ = A.compiled(m, shape, eps=EPS, fixed=fixed)
    case = make_case(m, shape, seed)
    outs = outputs(side, m, "cuda")
    kv = make_kv(m, shape, seed, pad_last) if fixed else None
    work = A.workspace(side, "cuda")
    dump = torch.full((m, shape.nq), float("nan"), device="cuda")
    _poison(*outs, work.q_parts, work.ss)
    if fixed:  # the first launch adds into parity 1 and must zero parity 0 for the next
        work.acc[0].fill_(12345)
        work.arrivals[:side.tiles1].fill_(7)
    A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                case["gamma"], case["wb"], case["wsb"], *outs, work, eps=EPS, grid=grid,
                dump=dump, fixed=fixed, **(kv or {}))
    torch.cuda.synchronize()
    A.check_sync(work)
    assert int(work.sync[A.EPOCH]) == 2, "the epoch did not move on after the launch"
    if fixed:
        counts = work.arrivals.view(2, side.tiles1)
        assert int(work.sync[A.DONE]) == 0 and not counts[0].any() and not work.acc[0].any(), \
            "the next launch's sums and counts not zeroed"
        assert (counts[1] == side.split1).all(), f"tiles' counts {counts[1].tolist()}"
    else:
        assert int(work.sync[A.DONE]) == 0 and not work.arrivals.any(), \
            "counters not back at zero"
    kv_parts, q_rows, qb_parts = outs
    for name, t in zip(("kv_parts", "q_rows", "qb_parts", "dump"), (*outs, dump)):
        if not (fixed and name == "kv_parts"):
            assert not t.isnan().any(), f"{name}: {int(t.isnan().sum())} elements not written"

    x = case["xq"][:m].double() * case["sx"].double().repeat_interleave(128, 1)
    if fixed:
        assert kv_parts.isnan().all(), "the fixed form wrote kv_parts"
        ref_kv, sc_kv = _chunks(x, _deq(case["wkv"], case["wskv"]), 1)
        check_kv_rows(kv, ref_kv[0], sc_kv[0], shape.nkv - A.ROPE)
        outs = (q_rows, qb_parts, kv["kv_cache"])  # what the fixed form writes
    else:
        ref_kv, sc_kv = _chunks(x, _deq(case["wkv"], case["wskv"]), side.split1)
        err = (kv_parts.double() - ref_kv).abs()
        assert (err <= TOL_MMA * sc_kv + 1e-30).all(), \
            f"kv_parts worst {(err / sc_kv).max():.2e}"

    ref_q, sc_q = _chunks(x, _deq(case["wq"], case["wsq"]), 1)
    ref_q, sc_q = ref_q[0], sc_q[0]
    err = (q_rows.double() - ref_q).abs()
    bound = TOL_MMA * sc_q + 2.0 ** -8 * ref_q.abs() + 1e-30
    assert (err <= bound).all(), f"q_rows worst {(err / bound).max():.2f} of its bound"

    # q_b's B operand (the kernel's own, dumped) against c_q normed and quantized in fp32
    # from the kernel's c_q: the sum of squares' order and rsqrt may move an element across
    # a bf16, then an e4m3 tie (one e4m3 step), rarely
    xb = dump.double()
    ref_x = normed_quant(q_rows, case["gamma"], shape.nq)
    off = (xb - ref_x).abs() > 2.0 ** -20 * ref_x.abs()  # the dump's fp32 product
    groups = off.view(m, -1, 128).any(-1)
    ref_s = ref_x.view(m, -1, 128).abs().amax(-1) / 448
    got_s = xb.view(m, -1, 128).abs().amax(-1) / 448
    print(f"m={m}: q_b's x differs from the fp32 reference in {int(off.sum())} of "
          f"{off.numel()} elements, {int(groups.sum())} (row, group)s")
    assert off.double().mean() <= 1e-2, (
        f"q_b's x: {int(off.sum())} of {off.numel()} elements differ, in {int(groups.sum())} "
        f"(row, group)s {groups.nonzero().tolist()[:8]}; their amax/448 "
        f"{got_s[groups].tolist()[:4]} against {ref_s[groups].tolist()[:4]}; first values "
        f"{xb[off].tolist()[:6]} against "
        f"{ref_x[off].tolist()[:6]}")
    assert ((xb - ref_x).abs() <= 2.0 ** -3 * ref_x.abs() + 2.0 ** -9 * ref_s.repeat_interleave(
        128, 1) + 1e-30).all(), "q_b's x: an element beyond one e4m3 step"
    # q_b on that operand: fp8_mma's bound
    wb = _deq(case["wb"], case["wsb"])
    ref_b, sc_b = _chunks(xb, wb, side.split2)
    err = (qb_parts.double() - ref_b).abs()
    assert (err <= TOL_MMA * sc_b + 1e-30).all(), \
        f"qb_parts worst {(err / (TOL_MMA * sc_b + 1e-30)).max():.1f}x TOL_MMA"

    first = [t.clone() for t in outs]
    launched = (kv_parts, q_rows, qb_parts)
    _poison(*outs)
    _launch(case, launched, work, grid, kv=kv)  # without the dump
    torch.cuda.synchronize()
    for a, b in zip(outs, first):
        assert torch.equal(_bits(a), _bits(b)), \
            "the launch without the dump differs from the one with it"
    if m in (1, 16) and grid == 0:  # launched plainly: bitwise the same
        _poison(*outs)
        _launch(case, launched, work, grid, pdl=False, kv=kv)
        torch.cuda.synchronize()
        for a, b in zip(outs, first):
            assert torch.equal(_bits(a), _bits(b)), \
                "the plain launch differs from the dependent one"
    epoch = int(work.sync[A.EPOCH])
    for i in range(repeats):
        _poison(*outs)
        _launch(case, launched, work, grid, kv=kv)
        torch.cuda.synchronize()
        for a, b in zip(outs, first):
            assert torch.equal(_bits(a), _bits(b)), f"launch {i + 2} differs from the first"
    A.check_sync(work)
    assert int(work.sync[A.EPOCH]) == epoch + repeats

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _launch(case, launched, work, grid, kv=kv)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        _launch(case, launched, work, grid, kv=kv)
    for _ in range(3):
        _poison(*outs)
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip(outs, first):
            assert torch.equal(_bits(a), _bits(b)), "graph replay differs from the eager launch"
    A.check_sync(work)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 9, 16])
def test_tp8_rank(m):
    check(m, A.Shape(), seed=m)


def test_small_shape_fewer_units_than_workers():
    check(3, A.Shape(nq=512, nkv=192, k1=1024, nb=512), seed=11)


@pytest.mark.parametrize("m", [1, 2])
def test_fixed_tp8_rank(m):
    check(m, A.Shape(), seed=40 + m, fixed=True)


def test_fixed_small_shape_few_ctas():
    check(2, A.Shape(nq=512, nkv=192, k1=1024, nb=512), seed=43, grid=5, repeats=5, fixed=True,
          pad_last=True)


def fold_inputs(m: int, k1: int, seed: int):
    """The layer's input norm's inputs (hidden, residual, weight: bf16, a residual stream's
    spread) and, emulated in torch as the kernel makes it, x of the un-normed row (bf16(s w)
    quantized per 128 columns: e4m3 [M, K1] and scales [M, K1/128]) and each row's rstd."""
    g = torch.Generator(device="cuda").manual_seed(seed + 2000)
    hidden = (torch.randn(m, k1, device="cuda", generator=g) * 3).to(torch.bfloat16)
    residual = (torch.randn(m, k1, device="cuda", generator=g) * 8).to(torch.bfloat16)
    weight = (1 + 0.3 * torch.randn(k1, device="cuda", generator=g)).to(torch.bfloat16)
    s = hidden.float() + residual.float()
    y = (s * weight.float()).to(torch.bfloat16).float().view(m, -1, 128)
    xq, sc = quant_128(y)
    rstd = torch.rsqrt(s.double().square().mean(-1) + EPS)
    return hidden, residual, weight, xq.view(m, k1), sc.view(m, -1), rstd


def check_norm_in(m: int, shape: A.Shape, seed: int, grid: int = 0, repeats: int = 20,
                  pad_last: bool = False):
    """The fixed form with the layer's input norm folded in (norm_in): its x never read (NaN),
    made in the launch from hidden + residual; the new residual bitwise bf16(hidden +
    residual), the residual read left as it was; c_q and the KV-cache rows against float64
    x' W^T times the row's rstd (x' the un-normed row's own e4m3, emulated in torch bitwise:
    the launch's 1 / scale, bf16 and e4m3 conversions all round to nearest, as torch's); q_b's
    operand and q_b as ``check`` checks them; repeated launches and a graph replay bitwise."""
    side, _ = A.compiled(m, shape, eps=EPS, fixed=True, norm_in=True)
    case = make_case(m, shape, seed)
    case["xq"].view(torch.uint8).fill_(0x7F)  # NaN: the launch must not read x
    case["sx"].fill_(float("nan"))
    hidden, residual, weight, xq1, sx1, rstd = fold_inputs(m, shape.k1, seed)
    kept = residual.clone()
    res_out = torch.full_like(residual, float("nan"))
    fold = (hidden, residual, weight, res_out)
    outs = outputs(side, m, "cuda")
    kv = make_kv(m, shape, seed, pad_last)
    work = A.workspace(side, "cuda")
    dump = torch.full((m, shape.nq), float("nan"), device="cuda")
    _poison(*outs, work.q_parts, work.ss, work.ss_in)

    def launch(dump=None):
        A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                    case["gamma"], case["wb"], case["wsb"], *outs, work, eps=EPS, grid=grid,
                    dump=dump, fixed=True, norm_in=fold, **kv)

    launch(dump)
    torch.cuda.synchronize()
    A.check_sync(work)
    _, q_rows, qb_parts = outs
    assert torch.equal(_bits(residual), _bits(kept)), "the residual read was written"
    want = (hidden.float() + residual.float()).to(torch.bfloat16)
    assert torch.equal(_bits(res_out), _bits(want)), \
        f"new residual: {int((_bits(res_out) != _bits(want)).sum())} elements off"
    for name, t in (("q_rows", q_rows), ("qb_parts", qb_parts), ("dump", dump),
                    ("ss_in", work.ss_in)):
        assert not t.isnan().any(), f"{name}: {int(t.isnan().sum())} elements not written"
    ss = (hidden.double() + residual.double()).square().view(m, side.split1, -1).sum(-1)
    assert torch.allclose(work.ss_in.view(side.split1, m).double(), ss.T, rtol=1e-5), \
        "the chunks' sums of squares"

    x = xq1.double() * sx1.double().repeat_interleave(128, 1)
    r = rstd[:, None]
    ref_kv, sc_kv = _chunks(x, _deq(case["wkv"], case["wskv"]), 1)
    check_kv_rows(kv, ref_kv[0] * r, sc_kv[0] * r, shape.nkv - A.ROPE)
    wq = _deq(case["wq"], case["wsq"])
    ref_q, sc_q = _chunks(x, wq, 1)
    ref_q, sc_q = ref_q[0] * r, sc_q[0] * r
    err = (q_rows.double() - ref_q).abs()
    bound = TOL_MMA * sc_q + 2.0 ** -8 * ref_q.abs() + 1e-30
    over = err > bound
    assert not over.any(), (
        f"q_rows worst {(err / bound).max():.2f} of its bound, {int(over.sum())} of "
        f"{over.numel()} over it, in rows {over.any(1).nonzero().flatten().tolist()} and "
        f"128-column groups {over.view(m, -1, 128).any(-1).any(0).nonzero().flatten().tolist()};"
        f" median |err| / |ref| {float((err / (ref_q.abs() + 1e-30)).median()):.2e} (a wrong "
        f"rstd moves every element alike)")
    xb = dump.double()
    ref_x = normed_quant(q_rows, case["gamma"], shape.nq)
    off = (xb - ref_x).abs() > 2.0 ** -20 * ref_x.abs()
    assert off.double().mean() <= 1e-2, f"q_b's x: {int(off.sum())} of {off.numel()} differ"
    ref_b, sc_b = _chunks(xb, _deq(case["wb"], case["wsb"]), side.split2)
    err = (qb_parts.double() - ref_b).abs()
    assert (err <= TOL_MMA * sc_b + 1e-30).all(), \
        f"qb_parts worst {(err / (TOL_MMA * sc_b + 1e-30)).max():.1f}x TOL_MMA"

    first = [t.clone() for t in (q_rows, qb_parts, kv["kv_cache"], res_out)]
    mine = (q_rows, qb_parts, kv["kv_cache"], res_out)
    for i in range(repeats):
        _poison(q_rows, qb_parts, res_out, work.ss_in)
        launch()
        torch.cuda.synchronize()
        for a, b in zip(mine, first):
            assert torch.equal(_bits(a), _bits(b)), f"launch {i + 2} differs from the first"
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        launch()
    torch.cuda.current_stream().wait_stream(st)
    with torch.cuda.graph(g):
        launch()
    for _ in range(3):
        _poison(q_rows, qb_parts, res_out, work.ss_in)
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip(mine, first):
            assert torch.equal(_bits(a), _bits(b)), "graph replay differs from the eager launch"
    A.check_sync(work)


@pytest.mark.parametrize("m,pad_last", [(1, False), (2, False), (2, True)])
def test_norm_in_tp8_rank(m, pad_last):
    check_norm_in(m, A.Shape(), seed=60 + m, pad_last=pad_last)


def test_norm_in_small_shape_few_ctas():
    check_norm_in(2, A.Shape(nq=512, nkv=192, k1=1024, nb=512), seed=63, grid=5, repeats=5)


def test_norm_in_refusals():
    with pytest.raises(ValueError, match="fixed form's"):
        A.AttnSide(1, norm_in=True)
    side, _ = A.compiled(1, eps=EPS, fixed=True, norm_in=True)
    case = make_case(1, A.Shape(), 0)
    hidden, residual, weight, *_ = fold_inputs(1, A.Shape().k1, 0)
    work = A.workspace(side, "cuda")
    kv = make_kv(1, A.Shape(), 0, False)
    with pytest.raises(ValueError, match="overlaps the residual"):
        A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                    case["gamma"], case["wb"], case["wsb"], *outputs(side, 1, "cuda"), work,
                    eps=EPS, fixed=True, norm_in=(hidden, residual, weight, residual), **kv)


@pytest.mark.parametrize("m", [1, 16])
def test_few_ctas_many_units_each(m):
    check(m, A.Shape(), seed=20 + m, grid=6, repeats=3)


def test_refuses_bad_shapes():
    with pytest.raises(ValueError, match="rows"):
        A.AttnSide(17)
    with pytest.raises(ValueError, match="multiple of 256"):
        A.AttnSide(4, A.Shape(nq=2000))
    with pytest.raises(ValueError, match="fixed form takes 1..2 rows"):
        A.AttnSide(3, fixed=True)
    side, _ = A.compiled(2)
    case = make_case(2, A.Shape(), 0)
    kv, q, qb = outputs(side, 2, "cuda")
    with pytest.raises(ValueError, match="gamma"):
        A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                    case["gamma"].float(), case["wb"], case["wsb"], kv, q, qb,
                    A.workspace(side, "cuda"))
