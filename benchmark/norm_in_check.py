"""attn_side's norm_in (the input norm folded in) against the plain fixed form fed torch's
emulation of its x, on the GPU: for the small shape with 5 CTAs (where its test's c_q once
exceeded fp8_mma's bound 2.86x) and every CTA, and one TP8 rank with 5 CTAs, how many c_q
elements exceed the bound for the fold and for the plain form times rstd, and where the two
differ by 128-column group. A diagnostic: it prints, it asserts nothing.

    PYTHONPATH=python:sgl-kernel-ext:. python3 benchmark/norm_in_check.py
"""
import sys
import torch
sys.path.insert(0, "test/srt/kernels")
import test_sm90_attn_side as T  # noqa: E402
from sgl_kernel_ext.nvidia.sm90 import attn_side as A  # noqa: E402

for shape, grid, m in ((A.Shape(nq=512, nkv=192, k1=1024, nb=512), 5, 2),
                       (A.Shape(nq=512, nkv=192, k1=1024, nb=512), 0, 2),
                       (A.Shape(), 5, 2)):
    seed = 63
    side, _ = A.compiled(m, shape, eps=T.EPS, fixed=True, norm_in=True)
    plain, _ = A.compiled(m, shape, eps=T.EPS, fixed=True)
    case = T.make_case(m, shape, seed)
    hidden, residual, weight, xq1, sx1, rstd = T.fold_inputs(m, shape.k1, seed)
    kv = T.make_kv(m, shape, seed, False)
    outs = T.outputs(side, m, "cuda")
    work = A.workspace(side, "cuda")
    res_out = torch.empty_like(residual)
    A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                case["gamma"], case["wb"], case["wsb"], *outs, work, eps=T.EPS, grid=grid,
                fixed=True, norm_in=(hidden, residual, weight, res_out), **kv)
    torch.cuda.synchronize()
    q_fold = outs[1].clone()
    case["xq"][:m] = xq1
    case["sx"].copy_(sx1)
    outs2 = T.outputs(plain, m, "cuda")
    work2 = A.workspace(plain, "cuda")
    kv2 = T.make_kv(m, shape, seed, False)
    A.attn_side(case["xq"], case["sx"], case["wq"], case["wsq"], case["wkv"], case["wskv"],
                case["gamma"], case["wb"], case["wsb"], *outs2, work2, eps=T.EPS, grid=grid,
                fixed=True, **kv2)
    torch.cuda.synchronize()
    q_plain = outs2[1].double() * rstd[:, None]
    x = xq1.double() * sx1.double().repeat_interleave(128, 1)
    ref, sc = T._chunks(x, T._deq(case["wq"], case["wsq"]), 1)
    ref, sc = ref[0] * rstd[:, None], sc[0] * rstd[:, None]
    bound = T.TOL_MMA * sc + 2.0 ** -8 * ref.abs() + 1e-30
    for name, q in (("fold", q_fold.double()), ("plain*rstd", q_plain)):
        err = (q - ref).abs()
        bad = (err > bound)
        print(shape, grid, name, "worst", float((err / bound).max()), "bad", int(bad.sum()),
              "of", bad.numel(), "cols", bad.nonzero()[:12].tolist())
    d = (q_fold.double() - q_plain).abs() / (q_plain.abs() + 1e-9)
    print("fold vs plain*rstd rel: max", float(d.max()), "by 128-col group",
          d.view(m, -1, 128).amax(-1).tolist())
    print("rstd", rstd.tolist(), "ss_in", work.ss_in.tolist())
