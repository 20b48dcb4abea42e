"""Counter-based random numbers: a value is a hash of (seed, tensor name, global element index).

Any slice of a logical tensor (one TP rank's share, one expert, one layer) is produced on any
device without producing the rest, and the values do not depend on the device or on how the
tensor is sliced: one TP8 rank built on a GPU holds exactly the rows the TP1 tensor built on a
CPU holds. Only integer ops and exact float conversions are used, so CPU and GPU agree bitwise
(checked on an H200 for every tensor of the tiny model:
benchmark/results/reference_real_shapes_h200_run2.json).
"""

from __future__ import annotations

import hashlib
from typing import Sequence, Tuple

import torch

_CHUNK = 1 << 24  # elements hashed per pass (bounds the temporaries)


def key32(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little")


def _i32(v: int) -> int:
    """A 32-bit pattern as the signed int32 value torch stores for it."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _hash(x: torch.Tensor, key: int) -> torch.Tensor:
    """lowbias32 of (index ^ key) on int32 (products wrap mod 2^32; shifts masked to be logical)."""
    x = x ^ _i32(key)
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _i32(0x7FEB352D)
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _i32(0x846CA68B)
    return x ^ ((x >> 16) & 0xFFFF)


def uniform(
    seed: int,
    name: str,
    full_shape: Sequence[int],
    index: Sequence[Tuple[int, int]] | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """fp32 values uniform in [-1, 1) for the slice `index` (one (start, stop) per dim) of the
    logical tensor `name` of shape `full_shape`."""
    full_shape = list(full_shape)
    if index is None:
        index = [(0, n) for n in full_shape]
    assert len(index) == len(full_shape)
    for (a, b), n in zip(index, full_shape):
        assert 0 <= a <= b <= n, (name, index, full_shape)
    key = key32(seed, name)
    out_shape = [b - a for a, b in index]
    out = torch.empty(out_shape, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out
    total = 1
    for n in full_shape:
        total *= n
    assert total < 1 << 32, f"{name}: {total} elements exceed the 32-bit counter"
    strides = [1] * len(full_shape)
    for d in range(len(full_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * full_shape[d + 1]
    # flat index of the slice's elements = base of the leading index + offset of the rest
    inner = torch.zeros((), dtype=torch.int32, device=device)
    for d in range(1, len(full_shape)):
        a, b = index[d]
        ar = torch.arange(a, b, dtype=torch.int64, device=device) * strides[d]
        inner = inner.unsqueeze(-1) + _wrap32(ar)
    inner_n = max(1, inner.numel())
    rows_per_chunk = max(1, _CHUNK // inner_n)
    a0, b0 = index[0]
    for r0 in range(a0, b0, rows_per_chunk):
        r1 = min(b0, r0 + rows_per_chunk)
        lead = _wrap32(torch.arange(r0, r1, dtype=torch.int64, device=device) * strides[0])
        flat = lead.view(-1, *([1] * (len(full_shape) - 1))) + inner
        h = _hash(flat, key)
        u = ((h >> 8) & 0xFFFFFF).to(torch.float32) * (2.0**-23) - 1.0
        out[r0 - a0 : r1 - a0] = u
    return out


def _wrap32(x: torch.Tensor) -> torch.Tensor:
    """int64 values < 2^32 as int32 bit patterns."""
    return torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)
