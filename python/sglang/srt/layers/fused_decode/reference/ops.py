"""Elementwise pieces of the GLM-5.3 layer: RMSNorm, LayerNorm, interleaved RoPE, SiLU-and-mul.

Each computes in fp32 and rounds once where SGLang's CUDA kernel writes its output (the caller
picks the dtype). RoPE uses fp32 cos/sin of fp32 position x inverse-frequency, as SGLang's CUDA
rope cache does, with GLM-5.3's interleaved pairs (2i, 2i+1).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype) -> torch.Tensor:
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * weight.to(torch.float32)).to(out_dtype)


def add_rms_norm(
    x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor, eps: float, out_dtype
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm: the sum is kept in `out_dtype` as the new residual, the norm
    is taken of the unrounded fp32 sum. Without a residual, x itself becomes the residual."""
    if residual is None:
        return rms_norm(x, weight, eps, out_dtype), x.to(out_dtype)
    s = x.to(torch.float32) + residual.to(torch.float32)
    return rms_norm(s, weight, eps, out_dtype), s.to(out_dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 LayerNorm (the indexer's k_norm), fp32 out."""
    xf = x.to(torch.float32)
    return torch.nn.functional.layer_norm(
        xf, (xf.shape[-1],), weight.to(torch.float32), bias.to(torch.float32), eps
    )


def rope_cos_sin(positions: torch.Tensor, rot_dim: int, theta: float):
    """fp32 cos, sin [M, rot_dim/2] for integer positions."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=positions.device) / rot_dim)
    )
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    return freqs.cos(), freqs.sin()


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float, rot_dim: Optional[int] = None):
    """Rotate pairs (2i, 2i+1) of the first `rot_dim` dims of x [M, ..., D] by position x freq_i.
    Returns fp32; the rest of the dims pass through."""
    xf = x.to(torch.float32)
    d = rot_dim or xf.shape[-1]
    cos, sin = rope_cos_sin(positions, d, theta)
    shape = [cos.shape[0]] + [1] * (xf.dim() - 2) + [cos.shape[1]]
    cos, sin = cos.view(shape), sin.view(shape)
    rot = xf[..., :d]
    x1, x2 = rot[..., 0::2], rot[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, xf[..., d:]), dim=-1)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor, out_dtype) -> torch.Tensor:
    g = gate.to(torch.float32)
    return (torch.nn.functional.silu(g) * up.to(torch.float32)).to(out_dtype)
