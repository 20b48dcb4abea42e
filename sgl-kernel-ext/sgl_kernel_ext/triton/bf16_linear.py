"""Small-M bf16 linear with a split K: fp32 partial products [SPLIT, M, N].

For the narrow bf16 matrices of a decode layer (the router's [256, 6144], the indexer's
merged wk / weights_proj [160, 6144]): too few output columns to fill the GPU, so K is split
too and the consumer sums the SPLIT partials in a fixed order (deterministic, no atomics).
At one row (GEMV_MAX_ROWS) each program loads its whole K chunk at once and multiplies it
into the row in fp32 instead of looping over MMAs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import overlap
from .fp8_linear import block_m, interpreting
from .overlap import prefetch_rows, stage_begin


@triton.jit
def _bf16_linear_prefetch(tile, split, K, w_ptr, N, k_chunk, BLOCK_N: tl.constexpr,
                          PDL: tl.constexpr):
    cols = tl.minimum(k_chunk, K - split * k_chunk) * 2
    prefetch_rows(w_ptr, tile * BLOCK_N, BLOCK_N, N, K * 2, split * k_chunk * 2, cols, PDL,
                  BLOCK_N, 4)


@triton.jit
def _bf16_linear_task(tile, split, x_ptr, stride_xm, M, K, w_ptr, part_ptr, N, k_chunk,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      INTERPRET: tl.constexpr, GEMV: tl.constexpr):
    """Program (tile, split); with GEMV (a few rows, BLOCK_K >= k_chunk) the chunk is one
    load and an fp32 multiply-and-sum per row instead of a loop of MMAs."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = split * k_chunk
    if GEMV:
        k = k_lo + tl.arange(0, BLOCK_K)
        k_ok = (k < k_lo + k_chunk) & (k < K)
        w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        for r in tl.static_range(BLOCK_M):
            x = tl.load(x_ptr + r * stride_xm + k, mask=k_ok & (r < M), other=0.0)
            acc += tl.where(offs_m[:, None] == r,
                            tl.sum(w * x.to(tl.float32)[None, :], axis=1)[None, :], 0.0)
    else:
        for k0 in range(k_lo, k_lo + k_chunk, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :],
                        mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            if INTERPRET:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
            else:
                acc += tl.dot(x, tl.trans(w))
    out = part_ptr + split * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & n_ok[None, :])


@triton.jit
def _bf16_linear_splitk_kernel(x_ptr, stride_xm, M, K, w_ptr, part_ptr, N, k_chunk,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
                               PDL: tl.constexpr, GEMV: tl.constexpr, PREFETCH: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    _bf16_linear_prefetch(tile, split, K, w_ptr, N, k_chunk, BLOCK_N, PDL and PREFETCH)
    stage_begin(PDL)
    _bf16_linear_task(tile, split, x_ptr, stride_xm, M, K, w_ptr, part_ptr, N, k_chunk,
                      BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET, GEMV)


BLOCK_N = 16  # output columns per program
# rows up to which a program multiplies its whole K chunk at once without the tensor cores:
# on an H200 at one row the MoE layer is 0.9 us faster, the dense and MoE+indexer layers
# (whose indexer also runs one: wk|weights_proj) 4.4 and 5.3 us (tiling_probe_20261201T051737Z);
# at two rows those two are 3.8-3.9 us faster, the MoE layer the same (T053337Z)
GEMV_MAX_ROWS = 2


def launch_shape(m: int, k: int, split: int, block_k: int = 128) -> tuple:
    """(BLOCK_M, BLOCK_K, GEMV) of m rows: the GEMV form's BLOCK_K spans a whole K chunk."""
    if m <= GEMV_MAX_ROWS:
        return block_m(m, True), triton.next_power_of_2(chunk_cols(k, split, block_k)), True
    return block_m(m), block_k, False


def chunk_cols(k: int, split: int, block_k: int = 128) -> int:
    """Columns per K chunk (a multiple of block_k)."""
    return triton.cdiv(triton.cdiv(k, split), block_k) * block_k


def bf16_linear_splitk(x: torch.Tensor, w: torch.Tensor, parts: torch.Tensor,
                       block_n: int = BLOCK_N, block_k: int = 128) -> None:
    """parts[s] = x[:, chunk s] W[:, chunk s]^T in fp32; parts [SPLIT, M, N] contiguous."""
    m, k = x.shape
    split, pm, n = parts.shape
    assert x.stride(1) == 1 and w.is_contiguous() and w.shape == (n, k) and pm == m
    assert parts.is_contiguous() and parts.dtype == torch.float32
    bm, bk, gemv = launch_shape(m, k, split, block_k)
    _bf16_linear_splitk_kernel[(triton.cdiv(n, block_n), split)](
        x, x.stride(0), m, k, w, parts, n, chunk_cols(k, split, block_k),
        BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=bk, INTERPRET=interpreting(),
        PDL=overlap.enabled(), GEMV=gemv, PREFETCH=overlap.prefetches("bf16_linear"),
        num_warps=4, num_stages=4, **overlap.launch_kw(),
    )
