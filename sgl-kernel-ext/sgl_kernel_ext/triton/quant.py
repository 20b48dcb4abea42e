"""Shared Triton pieces: fp32 -> e4m3 conversion that is right under the CPU interpreter too.

The GPU's conversion rounds to nearest even. Triton's interpreter does not (100.0 became
104, 127.9 became 64), so under the interpreter the rounding is done in fp32 arithmetic
first, leaving the cast only exactly representable values.
"""

import triton
import triton.language as tl


@triton.jit
def to_e4m3(v, INTERPRET: tl.constexpr):
    """v (fp32, already clamped to +-448) as e4m3, rounded to nearest even."""
    if INTERPRET:
        a = tl.abs(v)
        e = tl.floor(tl.log2(tl.maximum(a, 0.015625)))  # 2^-6: below it, subnormal spacing
        ulp = tl.exp2(e - 3.0)
        t = a / ulp
        r = (t + 12582912.0) - 12582912.0  # 1.5 * 2^23: the fp32 add rounds t to even
        v = tl.where(v < 0, -r * ulp, r * ulp)
    return v.to(tl.float8e4nv)


@triton.jit
def store_row_groups(v, offs, n, xq_ptr, sx_ptr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """Quantize one row v [BLOCK] (fp32 holding bf16 values; columns >= n ignored) per 128
    columns as SGLang's per-token-group quant: e4m3 at xq_ptr[offs], one fp32 scale per group
    (max(amax, 1e-10) / 448) at sx_ptr[group]."""
    g = tl.reshape(tl.where(offs < n, v, 0.0), (BLOCK // 128, 128))
    s = tl.maximum(tl.max(tl.abs(g), axis=1), 1e-10) / 448.0
    q = tl.reshape(tl.clamp(g * (1.0 / s)[:, None], -448.0, 448.0), (BLOCK,))
    tl.store(xq_ptr + offs, to_e4m3(q, INTERPRET), mask=offs < n)
    gi = tl.arange(0, BLOCK // 128)
    tl.store(sx_ptr + gi, s, mask=gi * 128 < n)


@triton.jit
def sum_parts(part_ptr, SPLIT: tl.constexpr, stride_split, offs, mask):
    """fp32 sum, in split order, of SPLIT partials at part_ptr + s * stride_split + offs
    (unrolled, so the SPLIT loads are in flight together)."""
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(part_ptr + s * stride_split + offs, mask=mask, other=0.0)
    return acc


# Split-K sums as 64-bit integers in 2^-FIXED_BITS units: each K chunk adds its part with a
# relaxed atomic, and integer adds in any order give the same bits (so launches stay bitwise
# repeatable); the consumer reads the sum once and rounds it to fp32. Magnitudes up to 2^31.
FIXED_BITS: tl.constexpr = tl.constexpr(32)
_FIXED_ONE: tl.constexpr = tl.constexpr(2.0 ** 32)


@triton.jit
def add_fixed(ptr, v, mask):
    """Add fp32 v into the int64 sums at ptr (where mask), in 2^-FIXED_BITS units."""
    tl.atomic_add(ptr, (v * _FIXED_ONE).to(tl.int64), mask=mask, sem="relaxed")


@triton.jit
def load_fixed(ptr, offs, mask):
    """The int64 sums at ptr + offs as fp32 (0 where not mask)."""
    return tl.load(ptr + offs, mask=mask, other=0).to(tl.float32) * (1.0 / _FIXED_ONE)
