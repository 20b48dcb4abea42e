"""Small-M FP8 block-128 linear: y = x W^T for 1-16 rows, activation quantized in-kernel.

W is e4m3 [N, K] with one fp32 scale per 128x128 block; x is bf16 [M, K]. Each program owns
BLOCK_N output columns for every row: per 128-column group it quantizes x to e4m3 with
scale = max(amax, 1e-10)/448 (SGLang's per-token-group quant), takes the e4m3 dot with the
weight tile in fp32 and applies both scales, so one launch replaces SGLang's quant + GEMM
pair. Up to two matrices that share x (q_a and kv_a, q_b and the indexer's wq_b) run in one
launch: programs past the first matrix's tiles take the second.

Rows past M are zero-padded to the 16-row MMA minimum; nothing is written for them.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .quant import to_e4m3

FP8_MAX = 448.0
ACT_EPS = 1e-10
GROUP = 128


@triton.jit
def _tile(x_ptr, stride_xm, M, K, w_ptr, s_ptr, y_ptr, stride_ym, N, tile,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, 128)
    n_ok = offs_n < N
    kblocks = tl.cdiv(K, 128)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, kblocks):
        k = kb * 128 + offs_k
        k_ok = k < K
        w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :],
                    mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0).to(tl.float32)
        sx = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / 448.0
        xq = to_e4m3(tl.clamp(x * (1.0 / sx)[:, None], -448.0, 448.0), INTERPRET)
        if INTERPRET:  # bf16/fp8 dots are unreliable in the interpreter
            part = tl.dot(xq.to(tl.float32), tl.trans(w.to(tl.float32)))
        else:
            part = tl.dot(xq, tl.trans(w))
        sw = tl.load(s_ptr + (offs_n // 128) * kblocks + kb, mask=n_ok, other=0.0)
        acc += part * sx[:, None] * sw[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & n_ok[None, :])


@triton.jit
def _fp8_linear_kernel(x_ptr, stride_xm, M, K,
                       wa_ptr, sa_ptr, ya_ptr, stride_yam, NA, tiles_a,
                       wb_ptr, sb_ptr, yb_ptr, stride_ybm, NB,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    pid = tl.program_id(0)
    if pid < tiles_a:
        _tile(x_ptr, stride_xm, M, K, wa_ptr, sa_ptr, ya_ptr, stride_yam, NA, pid,
              BLOCK_M, BLOCK_N, INTERPRET)
    else:
        _tile(x_ptr, stride_xm, M, K, wb_ptr, sb_ptr, yb_ptr, stride_ybm, NB, pid - tiles_a,
              BLOCK_M, BLOCK_N, INTERPRET)


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def block_m(m: int) -> int:
    if not 1 <= m <= 64:
        raise ValueError(f"small-M kernels take 1..64 rows, got {m}")
    return max(16, triton.next_power_of_2(m))


def fp8_linear(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, out: torch.Tensor,
               wq_b: Optional[torch.Tensor] = None, ws_b: Optional[torch.Tensor] = None,
               out_b: Optional[torch.Tensor] = None, block_n: int = 16) -> None:
    """out[M, N] = x W^T (and out_b = x W_b^T in the same launch). x bf16 [M, K] (last dim
    contiguous), wq e4m3 [N, K] contiguous, ws fp32 [ceil(N/128), ceil(K/128)]."""
    m, k = x.shape
    assert x.stride(1) == 1 and wq.is_contiguous() and ws.is_contiguous() and wq.shape[1] == k
    assert out.shape == (m, wq.shape[0]) and out.stride(1) == 1
    tiles_a = triton.cdiv(wq.shape[0], block_n)
    tiles = tiles_a
    if wq_b is not None:
        assert wq_b.shape[1] == k and out_b.shape == (m, wq_b.shape[0]) and out_b.stride(1) == 1
        tiles += triton.cdiv(wq_b.shape[0], block_n)
    else:
        wq_b, ws_b, out_b = wq, ws, out
    _fp8_linear_kernel[(tiles,)](
        x, x.stride(0), m, k,
        wq, ws, out, out.stride(0), wq.shape[0], tiles_a,
        wq_b, ws_b, out_b, out_b.stride(0), wq_b.shape[0],
        BLOCK_M=block_m(m), BLOCK_N=block_n, INTERPRET=interpreting(),
        num_warps=4, num_stages=4,
    )
