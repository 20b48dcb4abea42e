"""The CuTe DSL FP8 linear (``sgl_kernel_ext.nvidia.sm90.fp8_mma``: wgmma, 1-16 rows, K
chunks) against a float64 torch reference on an H200: one decode layer's matrix shapes and
ragged ones (rows not a multiple of the tile, fewer tiles than multiprocessors, a 128-column
K); outputs poisoned with NaN before each launch and every element checked, x's rows past M
NaN; repeated launches and a CUDA-graph replay bitwise equal to the first launch; the
programmatic dependent launch bitwise equal to the plain one; the last-arrival row tails; two
matrices in one launch.

Run on the GPU machine with CuTe DSL importable (benchmark/sm90_run.sh stages it).
"""

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a Hopper GPU (run on the lent H200)", allow_module_level=True)
pytest.importorskip("cutlass", reason="needs CuTe DSL (nvidia-cutlass-dsl): benchmark/sm90_run.sh")

from sgl_kernel_ext.nvidia.sm90.fp8_mma import fp8_mma, split_for, x_rows  # noqa: E402

# |y - ref| <= TOL_MMA * sum_k |x_k w_k| (dequantized). wgmma's FP8 products are summed in its accumulator at less than fp32 precision within a
# 128-column group (then promoted to fp32 with the scales): 2^-11 of sum |x w|, where the
# first H200 run (c227058) measured up to 2e-4 of max |y| (sm90_smoke.py prints both); the
# layer rounds these outputs to bf16 (2^-8) right after
TOL_MMA = 2.0 ** -11


def _padded(xq):
    """xq in a buffer of the MMA's x rows, the rows past M NaN (e4m3 0x7f): they must not
    reach any output the kernel stores."""
    m, k = xq.shape
    buf = torch.full((x_rows(m), k), 0x7F, dtype=torch.uint8, device=xq.device)
    buf = buf.view(torch.float8_e4m3fn)
    buf[:m] = xq
    return buf


def _case(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    wq = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    ws = torch.rand((n + 127) // 128, k // 128, device="cuda", generator=g) + 0.01
    xq = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    sx = torch.rand(m, k // 128, device="cuda", generator=g) + 0.01
    return xq, sx, wq, ws


def _reference(xq, sx, wq, ws, split=1):
    """(y, bound's scale) in float64: the blockwise dequantized product and sum |x w|; with
    split, [split, M, N] of the K chunks."""
    m, k = xq.shape
    n = wq.shape[0]
    x = xq.double() * sx.double().repeat_interleave(128, dim=1)
    w = wq.double() * ws.double().repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)
    if split == 1:
        return x @ w.T, x.abs() @ w.abs().T
    xc, wc = x.view(m, split, k // split), w.view(n, split, k // split)
    return (torch.einsum("msk,nsk->smn", xc, wc),
            torch.einsum("msk,nsk->smn", xc.abs(), wc.abs()))


MMA_SHAPES = [(6144, 2048), (2624, 6144), (4608, 6144), (1000, 512), (40, 384), (6144, 256)]


@pytest.mark.parametrize("n,k", MMA_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 9, 16])
def test_mma_matches_reference(m, n, k):
    """Every K chunk of the tile grid's default split (K chunks so tiles fill the GPU once)."""
    split = split_for(n, k)
    xq, sx, wq, ws = _case(m, n, k, seed=m * 1000 + n + k + 1)
    ref, scale = _reference(xq, sx, wq, ws, split)
    xq = _padded(xq)
    parts = torch.full((split, m, n), float("nan"), device="cuda")
    fp8_mma(xq, sx, wq, ws, parts)
    torch.cuda.synchronize()
    assert not parts.isnan().any(), f"{int(parts.isnan().sum())} elements not written"
    err = (parts.double() - ref.view_as(parts)).abs()
    assert (err <= TOL_MMA * scale.view_as(parts) + 1e-30).all(), \
        f"worst {(err / (scale.view_as(parts) + 1e-30)).max().item():.2e}"

    first = parts.clone()
    for _ in range(10):
        parts.fill_(float("nan"))
        fp8_mma(xq, sx, wq, ws, parts)
    torch.cuda.synchronize()
    assert torch.equal(parts, first), "a repeated launch differs"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_mma(xq, sx, wq, ws, parts)
    parts.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(parts, first), "graph replay differs from eager"


@pytest.mark.parametrize("split,stages,grid,groups", [(1, 3, 2, 1), (4, 6, 3, 3), (12, 0, 0, 2), (2, 4, 5, 2)])
def test_mma_splits_small_rings_and_few_programs(split, stages, grid, groups):
    """Rings that wrap often, CTAs that walk many units, each split of K / 128 = 12."""
    m, n, k = 5, 1000, 1536
    xq, sx, wq, ws = _case(m, n, k, seed=split * 10 + groups)
    ref, scale = _reference(xq, sx, wq, ws, split)
    parts = torch.full((split, m, n), float("nan"), device="cuda")
    fp8_mma(_padded(xq), sx, wq, ws, parts, stages=stages, grid=grid, groups=groups)
    torch.cuda.synchronize()
    err = (parts.double() - ref.view_as(parts)).abs()
    assert (err <= TOL_MMA * scale.view_as(parts) + 1e-30).all()


@pytest.mark.parametrize("stages", [0, 4])
def test_mma_programmatic_launch_waits_for_its_input(stages):
    """With pdl the weights stream before the wait; x, written by the kernel just before,
    is read after it: bitwise the plain launch's output, eager and in a graph, with a ring
    deeper and shallower than a CTA's slots."""
    m, n, k = 3, 2624, 6144
    xq, sx, wq, ws = _case(m, n, k, seed=77)
    xq = _padded(xq)
    split = split_for(n, k)
    plain = torch.full((split, m, n), float("nan"), device="cuda")
    fp8_mma(xq, sx, wq, ws, plain, stages=stages)
    x_in = torch.zeros_like(xq)
    parts = torch.full_like(plain, float("nan"))
    for _ in range(3):
        x_in.zero_()
        parts.fill_(float("nan"))
        x_in.copy_(xq)
        fp8_mma(x_in, sx, wq, ws, parts, stages=stages, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(parts, plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x_in.zero_()
        x_in.copy_(xq)
        fp8_mma(x_in, sx, wq, ws, parts, stages=stages, pdl=True)
    parts.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(parts, plain)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 6144, 2048), (3, 2624, 6144), (16, 1000, 1536)])
def test_mma_row_tails_sum_the_chunks_in_order(m, n, k, pdl):
    """tails: the rows are bf16 of the chunks' in-order fp32 sum, bitwise; the counters are
    left at zero, so a second launch (a graph replay) does the same."""
    xq, sx, wq, ws = _case(m, n, k, seed=m + n)
    xq = _padded(xq)
    split = split_for(n, k)
    parts = torch.full((split, m, n), float("nan"), device="cuda")
    arrivals = torch.zeros(-(-n // 64), dtype=torch.int32, device="cuda")
    rows = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_mma(xq, sx, wq, ws, parts, pdl=pdl, tails=(arrivals, rows))
    for _ in range(2):
        parts.fill_(float("nan"))
        rows.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        total = parts[0].clone()
        for c in range(1, split):
            total += parts[c]
        assert not parts.isnan().any()
        assert torch.equal(rows, total.to(torch.bfloat16))
        assert int(arrivals.abs().sum()) == 0, "counters not left at zero"


@pytest.mark.parametrize("m,n,n2,k", [(1, 2048, 576, 6144), (3, 2048, 576, 6144),
                                      (16, 2048, 576, 6144), (5, 1000, 100, 512)])
def test_mma_two_matrices_in_one_launch(m, n, n2, k):
    """wq2/ws2/parts2 (q_a|kv_a): each matrix's chunks against its reference, pdl on."""
    xq, sx, wq, ws = _case(m, n, k, seed=m + n2)
    _, _, wq2, ws2 = _case(m, n2, k, seed=m + n2 + 1)
    split = split_for(n + n2, k)
    parts = torch.full((split, m, n), float("nan"), device="cuda")
    parts2 = torch.full((split, m, n2), float("nan"), device="cuda")
    fp8_mma(_padded(xq), sx, wq, ws, parts, stages=10, pdl=True, wq2=wq2, ws2=ws2,
            parts2=parts2)
    torch.cuda.synchronize()
    for out, w, s in ((parts, wq, ws), (parts2, wq2, ws2)):
        assert not out.isnan().any()
        ref, scale = _reference(xq, sx, w, s, split)
        assert ((out.double() - ref.view_as(out)).abs()
                <= TOL_MMA * scale.view_as(out) + 1e-30).all()


def test_mma_refuses_bad_input():
    xq, sx, wq, ws = _case(2, 256, 384, seed=3)
    with pytest.raises(ValueError, match="split must divide"):
        fp8_mma(_padded(xq), sx, wq, ws, torch.empty(2, 2, 256, device="cuda"))
    with pytest.raises(ValueError, match="tails' rows"):
        fp8_mma(_padded(xq), sx, wq, ws, torch.empty(1, 2, 256, device="cuda"),
                tails=(torch.zeros(4, dtype=torch.int32, device="cuda"),
                       torch.empty(2, 256, device="cuda")))
    with pytest.raises(ValueError, match="at least 8 rows"):
        fp8_mma(xq, sx, wq, ws, torch.empty(1, 2, 256, device="cuda"))
    with pytest.raises(ValueError, match="rows"):
        fp8_mma(torch.cat([xq] * 9), torch.cat([sx] * 9), wq, ws,
                torch.empty(1, 18, 256, device="cuda"))
