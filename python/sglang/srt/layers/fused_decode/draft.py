"""The MTP draft's own input path, in torch: what feeds its one fused decoder layer.

A GLM-5.3 draft step embeds the step's tokens, RMS-normalizes the embedding (``enorm``) and the
hidden state the previous step handed over (``hnorm``; the target's post-norm hidden state on
the first draft step, the draft's own after that), concatenates the two [M, 2H] and projects
them back to [M, H] with ``eh_proj`` (bf16, no bias). That [M, H] is the decoder layer's input
(no residual yet). These are two small norms and one GEMM of M rows: torch ops here, the fused
layer for the decoder layer, upstream's modules for the embedding, the head norm and the LM head.

Numerics follow upstream's CUDA ``fused_eh_norm``: each norm in fp32 of the bf16 input, scaled by
its weight, rounded once to bf16; the projection a bf16 GEMM with fp32 accumulation.
"""

from __future__ import annotations

import torch

from .reference.ops import rms_norm


def eh_hidden(embeds: torch.Tensor, prev_hidden: torch.Tensor, enorm: torch.Tensor,
              hnorm: torch.Tensor, eh_proj: torch.Tensor, eps: float) -> torch.Tensor:
    """The draft layer's input [M, H]: eh_proj([enorm(embeds); hnorm(prev_hidden)])."""
    if prev_hidden.shape[0] != embeds.shape[0]:
        raise ValueError(f"{embeds.shape[0]} draft rows but {prev_hidden.shape[0]} hidden "
                         "states handed over")
    dtype = eh_proj.dtype
    x = torch.cat((rms_norm(embeds, enorm, eps, dtype), rms_norm(prev_hidden, hnorm, eps, dtype)),
                  dim=-1)
    return torch.nn.functional.linear(x, eh_proj)
