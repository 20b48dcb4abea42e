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
