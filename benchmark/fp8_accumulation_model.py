"""CPU model of Hopper's FP8 wgmma accumulation, to ask whether fp8_mma's test bound
(TOL_MMA = 2^-11 of sum |x w|, plus 2^-8 of |ref| for a bf16 output) leaves room for the
tensor core's own error, for x quantized as the layer quantizes it (e4m3 per 128 columns,
scale amax / 448, as norm_in's fold and the norm kernels do) and as the kernel tests'
make_case draws it (e4m3(randn * 2), narrower in exponent).

The model (public measurements of sm_90's FP8 MMA, e.g. DeepSeek-V3's report, section 3.5.2):
per k32 instruction the 32 exact products and the accumulator are aligned to the largest
exponent among them and each floored at 2^(E - 13); the sum is kept with 13 mantissa bits
(truncated). A 128-column group is four such instructions into a zeroed accumulator, then
added into fp32 times its two scales, as attn_side's and fp8_mma's consumers do.

    python3 benchmark/fp8_accumulation_model.py [seed]

Prints, per K and x's kind: the worst and median error over the bound, the worst error over
sum |x w|, the mean signed error over sum |x w| (the truncation's bias), and the worst error
over the bound once the output is rounded to bf16 (as attn_side's c_q rows are)."""
import sys

import torch

F64 = torch.float64


def _exponent(a):
    return torch.floor(torch.log2(a.abs().clamp_min(1e-300)))


def _keep_bits(v, bits=13):
    q = 2.0 ** (_exponent(v) - bits)
    return torch.trunc(v / q) * q


def group_mma(x, w):
    """x [M, 128] and w [N, 128] (e4m3 values, float64): the modelled [M, N] product."""
    part = torch.zeros(x.shape[0], w.shape[0], dtype=F64)
    for k in range(0, 128, 32):
        terms = torch.cat([x[:, None, k:k + 32] * w[None, :, k:k + 32], part[..., None]], -1)
        step = 2.0 ** (_exponent(terms.abs().amax(-1, keepdim=True)) - 13)
        part = _keep_bits(torch.floor(terms / step).sum(-1) * step[..., 0])
    return part


def quantized_x(m, k, layer_like):
    if layer_like:  # a residual stream's spread times a norm weight, e4m3 per 128 columns
        y = ((torch.randn(m, k) * 3 + torch.randn(m, k) * 8) * (1 + 0.3 * torch.randn(k)))
        y = y.to(torch.bfloat16).float().view(m, -1, 128)
        s = y.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0
        xq = (y * (1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn).view(m, k)
        return xq.to(F64), s.view(m, -1).to(F64)
    xq = (torch.randn(m, k) * 2).to(torch.float8_e4m3fn)
    return xq.to(F64), torch.rand(m, k // 128, dtype=F64) * 0.02 + 1e-3


def run(k, layer_like, m=2, n=512):
    w = (torch.randn(n, k) * 2).to(torch.float8_e4m3fn).to(F64)
    ws = torch.rand(-(-n // 128), k // 128, dtype=F64) * 0.02 + 1e-3
    xq, sx = quantized_x(m, k, layer_like)
    acc = torch.zeros(m, n, dtype=torch.float32)
    for g in range(k // 128):
        cols = slice(g * 128, (g + 1) * 128)
        scale = ws[:, g].repeat_interleave(128)[:n][None, :].float() * sx[:, g:g + 1].float()
        acc = acc + group_mma(xq[:, cols], w[:, cols]).float() * scale
    wd = w * ws.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    x = xq * sx.repeat_interleave(128, 1)
    ref, total = x @ wd.T, x.abs() @ wd.abs().T
    err = acc.double() - ref
    bound = 2.0 ** -11 * total + 2.0 ** -8 * ref.abs()
    over = err.abs() / bound
    rows = (acc.to(torch.bfloat16).double() - ref).abs() / bound  # c_q's rows are bf16
    return (float(over.max()), float(over.median()), float((err.abs() / total).max()),
            float((err / total).mean()), float(rows.max()))


if __name__ == "__main__":
    torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print("K     x                 worst/bound  median/bound  worst/sum|xw|  bias/sum|xw|  "
          "bf16 worst/bound")
    for k in (1024, 6144):
        for layer_like in (False, True):
            worst, median, rel, bias, rows = run(k, layer_like)
            kind = "amax->448 (layer)" if layer_like else "e4m3(randn*2)    "
            print(f"{k:<5} {kind} {worst:11.3f}  {median:12.4f}  {rel:13.2e}  {bias:12.2e}  "
                  f"{rows:16.3f}")
