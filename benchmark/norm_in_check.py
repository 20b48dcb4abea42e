"""attn_side's norm_in (the input norm folded in) against the plain fixed form fed torch's
emulation of its x, on the GPU: where the fold's c_q goes wrong, if it does. A diagnostic: it
prints, it asserts nothing.

Two views, for the small shape on 5 CTAs (where its test's c_q once exceeded fp8_mma's bound
2.86x) and on every CTA, and one TP8 rank on 5 CTAs:
1. random weights (the test's case): how many c_q elements exceed the bound for the fold and
   for the plain form times rstd, their ratio by row (one factor a row: the row's rstd) and
   the largest difference by 128-column group (one group: that group's x or scale);
2. one-hot weights (wq[n, part * NQ + n] = 1, unit block scales), so that c_q[r, n] is the
   kernel's own x of column part * NQ + n, times its scale and rstd, with no sum to hide it
   in: every column of x read back against the emulation, mismatches named by (row, group).

    PYTHONPATH=python:sgl-kernel-ext:. python3 benchmark/norm_in_check.py
"""
import sys
import torch
sys.path.insert(0, "test/srt/kernels")
import test_sm90_attn_side as T  # noqa: E402
from sgl_kernel_ext.nvidia.sm90 import attn_side as A  # noqa: E402


def launch(case, m, shape, grid, seed, fold=None):
    """q_rows (and the fold's ss_in) of one launch, the fold's when fold is given."""
    side, _ = A.compiled(m, shape, eps=T.EPS, fixed=True, norm_in=fold is not None)
    outs = T.outputs(side, m, "cuda")
    work = A.workspace(side, "cuda")
    kv = T.make_kv(m, shape, seed, False)
    extra = {} if fold is None else {"norm_in": fold}
    A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                case["gamma"], case["wb"], case["wsb"], *outs, work, eps=T.EPS, grid=grid,
                fixed=True, **kv, **extra)
    torch.cuda.synchronize()
    return outs[1].double(), work.ss_in


def random_weights(shape, grid, m, seed, inputs):
    hidden, residual, weight, xq1, sx1, rstd = inputs
    case = T.make_case(m, shape, seed)
    q_fold, ss_in = launch(case, m, shape, grid, seed,
                           (hidden, residual, weight, torch.empty_like(residual)))
    case["xq"][:m] = xq1
    case["sx"].copy_(sx1)
    q_plain = launch(case, m, shape, grid, seed)[0] * rstd[:, None]
    x = xq1.double() * sx1.double().repeat_interleave(128, 1)
    ref, sc = T._chunks(x, T._deq(case["wq"], case["wsq"]), 1)
    ref, sc = ref[0] * rstd[:, None], sc[0] * rstd[:, None]
    bound = T.TOL_MMA * sc + 2.0 ** -8 * ref.abs() + 1e-30
    for name, q in (("fold", q_fold), ("plain*rstd", q_plain)):
        err = (q - ref).abs()
        bad = err > bound
        print(f"  random, {name}: worst {float((err / bound).max()):.2f} of the bound, "
              f"{int(bad.sum())} of {bad.numel()} over, median by row "
              f"{(err / bound).median(-1).values.tolist()}, first (row, col) "
              f"{bad.nonzero()[:8].tolist()}")
    big = q_plain.abs() > q_plain.abs().median()
    ratio = [float((q_fold[r][big[r]] / q_plain[r][big[r]]).median()) for r in range(m)]
    d = (q_fold - q_plain).abs() / (q_plain.abs() + 1e-9)
    by_group = [[round(v, 4) for v in r] for r in d.view(m, -1, 128).amax(-1).tolist()]
    print(f"  fold / plain*rstd by row (median): {ratio}; largest relative difference by "
          f"128-column group: {by_group}")
    split1 = ss_in.numel() // m
    want = (hidden.double() + residual.double()).square().view(m, split1, -1).sum(-1)
    err = (ss_in.view(split1, m).T.double() - want).abs() / want
    print(f"  ss_in worst relative error {float(err.max()):.2e}; rstd {rstd.tolist()}")


def one_hot(shape, grid, m, seed, inputs):
    """c_q of one-hot weights: the kernel's x of NQ columns a launch, against the emulation."""
    hidden, residual, weight, xq1, sx1, rstd = inputs
    nq, _, k1, _ = shape
    case = T.make_case(m, shape, seed)
    case["wsq"].fill_(1.0)
    x = xq1.double() * sx1.double().repeat_interleave(128, 1)
    for part in range(k1 // nq):
        w = torch.zeros(nq, k1, device="cuda")
        w[torch.arange(nq), part * nq + torch.arange(nq)] = 1.0
        case["wq"].copy_(w.to(torch.float8_e4m3fn))
        got = launch(case, m, shape, grid, seed,
                     (hidden, residual, weight, torch.empty_like(residual)))[0]
        cols = slice(part * nq, (part + 1) * nq)
        want = (x[:, cols] * rstd[:, None]).float().to(torch.bfloat16).double()
        off = got != want
        rel = ((got - want).abs() / (want.abs() + 1e-30))
        groups = off.view(m, -1, 128).sum(-1)
        first = [(r, c + part * nq, float(got[r, c]), float(want[r, c]))
                 for r, c in off.nonzero()[:6].tolist()]
        print(f"  one-hot, x columns {part * nq}..{(part + 1) * nq - 1}: {int(off.sum())} of "
              f"{off.numel()} differ from bf16(x' rstd); by (row, group) {groups.tolist()}; "
              f"worst relative {float(rel.max()):.3e}; first (row, col, got, want) {first}")
        if off.any():  # the same group's elements in a fixed ratio point at its scale
            r, c = off.nonzero()[0].tolist()
            g = slice(c // 128 * 128, c // 128 * 128 + 128)
            q = (got[r, g] / want[r, g])[want[r, g].abs() > 0]
            print(f"    row {r}, group {c // 128}: got / want min {float(q.min()):.5f} median "
                  f"{float(q.median()):.5f} max {float(q.max()):.5f}")


for shape, grid in ((A.Shape(nq=512, nkv=192, k1=1024, nb=512), 5),
                    (A.Shape(nq=512, nkv=192, k1=1024, nb=512), 0),
                    (A.Shape(), 5)):
    m, seed = 2, 63
    inputs = T.fold_inputs(m, shape.k1, seed)
    print(f"{shape}, grid {grid or 'every SM'}, {m} rows:", flush=True)
    random_weights(shape, grid, m, seed, inputs)
    one_hot(shape, grid, m, seed, inputs)
