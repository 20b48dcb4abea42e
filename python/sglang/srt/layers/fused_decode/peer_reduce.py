"""A TP group's all-reduce that can also take the residual add + RMSNorm after it into the
same launch (``sgl_kernel_ext.triton.peer_norm``, DESIGN kernel plan step 3).

The fused layers and ``runtime.run_layers`` take the group's all-reduce as a callable. Given a
``PeerReduce`` instead, they hand it the rows each all-reduce would have summed together with
the norm that reads the sum, so a layer boundary becomes one launch rather than two:

- inside a layer: the attention output's all-reduce and the post-attention norm;
- between layers: the MLP output's all-reduce and the next layer's input norm (the last
  layer's output still goes through the plain all-reduce, then the final norm).

Opt-in and not yet measured on GPUs (written 2026-12-05 without one): the served model still
hands the layers upstream's all-reduce. ``benchmark/peer_norm_probe.py`` decides whether the
model should build one over its TP group (``peer_norm.symmetric_rows``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch

if TYPE_CHECKING:  # imported where used: runtime imports this module without the extension
    from sgl_kernel_ext.triton import peer_norm


class PeerReduce:
    """The group's all-reduce (``all_reduce``, called for a plain sum) beside the fused
    all-reduce + norm over ``peers`` (this rank's receive buffers; every rank of the group
    must make the same calls in the same order)."""

    def __init__(self, peers: peer_norm.PeerRows,
                 all_reduce: Callable[[torch.Tensor], torch.Tensor]):
        self.peers = peers
        self.all_reduce = all_reduce

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(x)

    def add_rms_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                     weight: torch.Tensor, eps: float, out: Optional[torch.Tensor],
                     residual_out: torch.Tensor, out_q: Optional[torch.Tensor] = None,
                     out_s: Optional[torch.Tensor] = None) -> None:
        """``norm.add_rms_norm`` of x summed over the group (x: this rank's bf16 [M, H])."""
        from sgl_kernel_ext.triton import peer_norm

        peer_norm.all_reduce_add_rms_norm(x, self.peers, residual, weight, eps, out,
                                          residual_out, out_q, out_s)

    def failed(self) -> bool:
        """Whether a fused launch so far gave up waiting on a peer (syncs the host)."""
        from sgl_kernel_ext.triton import peer_norm

        return peer_norm.failed(self.peers)


def fuses_norm(reduce) -> bool:
    """Whether `reduce` takes the norm after it into its own launch (a ``PeerReduce``)."""
    return callable(getattr(reduce, "add_rms_norm", None))
