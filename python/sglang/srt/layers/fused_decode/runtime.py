"""The step executor of a covered step: upstream's tensors in, the post-norm hidden state out.

``step_rows`` builds the fused layers' ``RowBatch`` from upstream's addressing without a host
sync: row m's position, and which row of ``req_to_token`` (the KV pool's slot of each context
position) is its request's; the kernels read that table in place, so nothing a step copies
grows with the table's width (a server's longest context). A target-verify step has
``rows_per_req`` rows per request, each with its own position. Rows past the real row count
(CUDA-graph padding) get position -1: they read and write nothing (upstream writes their KV at
the dummy slot 0, which nothing reads).

``pool_caches`` views upstream's DSA pool as the layers' caches: the latent KV buffer
[slots + page, 1, 576] bf16 as [slots + page, 576], and the FP8 index-K cache of each indexer
layer as uint8 [pages, 64 * 132] (keys then fp32 scales per 64-token page, slot s at page
s // 64, offset s % 64: the layout of upstream's ``IndexKeyCache`` with index_kpool 1).

Top-k: the fused layers carry the top-k between layers as context positions (ascending, -1
padded), which they resolve through ``token_slots``. Upstream's indexer carries physical slots
(fused top-k) or positions; no upstream consumer reads the target's top-k after a decode or
verify step (the target publishes no MTP seed: the model package refuses a target step whose
``spec_info`` asks for one), so nothing is translated there. The MTP draft's top-k carried
across its iterations (``index_share_for_mtp_iteration``) arrives in upstream's space and is
converted once per draft step into the draft layer's top-k buffer (``fused_decode.carry``);
``run_layers`` hands it to the layer as ``carried``.

The MTP draft runs through the same executor: its plan holds its one decoder layer, keyed by
the reference's id ``num_hidden_layers`` while the draft's pool holds it at layer 0.

``run_layers`` runs the stack with ``reduce`` (the TP group's all-reduce): each layer sums its
attention output with it before its post-attention norm (on a TP shard), its MLP output is
all-reduced here, and ``final_norm(hidden, residual)`` finishes the deferred residual add
and the final RMSNorm, as upstream's ``residual_batch.final_norm`` does.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional, Sequence

import torch

from .peer_reduce import fuses_norm
from .reference.batch import RowBatch
from .reference.cache import INDEX_PAGE_BYTES, Caches
from .reference.config import INDEX_PAGE_SIZE

STALL_ENV = "SGLANG_FUSED_DECODE_INJECT_STALL"  # "<rank>:<fused step>:<seconds>", tests only

Reduce = Callable[[torch.Tensor], torch.Tensor]
FinalNorm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# check mode's per-layer hook: (layer index, layer, hidden, residual, batch, topk_prev,
# reuse_topk=, reduce=)
LayerHook = Callable[..., tuple]


class StepRows(RowBatch):
    """A RowBatch built on the device without the reference's host-side checks, whose slots
    stay in upstream's pool table: row m's are ``slot_table[slot_rows[m]]`` (req_to_token read
    in place by the kernels, so a step copies nothing that grows with the context)."""

    def __init__(self, positions: torch.Tensor, table: torch.Tensor, rows: torch.Tensor):
        self.positions, self._table, self._rows = positions, table, rows

    @property
    def slot_table(self) -> torch.Tensor:
        return self._table

    @property
    def slot_rows(self) -> torch.Tensor:
        return self._rows

    @property
    def token_slots(self) -> torch.Tensor:
        """The reference's [M, W] int64 table: a copy, for check mode."""
        return self._table.index_select(0, self._rows).to(torch.int64)


def step_rows(positions: torch.Tensor, req_to_token: torch.Tensor,
              req_pool_indices: torch.Tensor, rows_per_req: int, max_context: int,
              num_real_rows: Optional[torch.Tensor] = None) -> StepRows:
    """The rows of a decode (rows_per_req 1) or target-verify step; no host sync."""
    rows = req_pool_indices.to(torch.int64)
    if rows_per_req > 1:
        rows = rows.repeat_interleave(rows_per_req)
    pos = positions.to(torch.int64)
    if num_real_rows is not None:
        pad = torch.arange(pos.shape[0], device=pos.device) >= num_real_rows
        pos = pos.masked_fill(pad, -1)
    return StepRows(pos, req_to_token[:, :max_context], rows)


def pool_caches(kv_buffers: Dict[int, torch.Tensor],
                index_buffers: Dict[int, torch.Tensor], kv_cache_dim: int) -> Caches:
    """The layers' caches as views of upstream's pool buffers (refusing another layout)."""
    c = Caches()
    for lid, buf in kv_buffers.items():
        if buf.dtype != torch.bfloat16 or buf.shape[-1] != kv_cache_dim:
            raise ValueError(f"layer {lid}: KV buffer {tuple(buf.shape)} {buf.dtype}; the fused "
                             f"layers read raw bf16 rows of {kv_cache_dim}")
        c.kv[lid] = buf.view(buf.shape[0], kv_cache_dim)
    for lid, buf in index_buffers.items():
        if buf.dtype != torch.uint8 or buf.dim() != 2 or buf.shape[1] != INDEX_PAGE_BYTES:
            raise ValueError(f"layer {lid}: index-K buffer {tuple(buf.shape)} {buf.dtype}; the "
                             f"fused layers read uint8 pages of {INDEX_PAGE_SIZE} tokens x 132 B")
        c.index[lid] = buf
    return c


def run_layers(layers: Sequence, hidden: torch.Tensor, batch: RowBatch, reduce: Reduce,
               final_norm: FinalNorm, hook: Optional[LayerHook] = None,
               carried: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Every fused layer in order, then the final norm: the post-norm hidden state [M, H].
    `carried` (the MTP draft's top-k carried across its iterations) is attended by the first
    layer in place of its indexer. `reduce` runs twice a layer: inside it on the attention
    output, and here on its MLP output. A `reduce` that takes the norm after it into its
    launch (``peer_reduce.PeerReduce``) sums a layer's MLP output in the next layer's input
    norm instead (not under a hook: check mode compares each layer from its summed input);
    the last layer's is summed here, before the final norm."""
    residual, topk = None, carried
    across = fuses_norm(reduce) and hook is None
    partial = False
    for i, layer in enumerate(layers):
        kw = {"reduce": reduce}
        if carried is not None and i == 0:
            kw["reuse_topk"] = True
        if partial:
            kw["hidden_is_partial"] = True
        if hook is None:
            y, residual, topk = layer(hidden, residual, batch, topk, **kw)
        else:
            y, residual, topk = hook(i, layer, hidden, residual, batch, topk, **kw)
        partial = across and i + 1 < len(layers)
        hidden = y if partial else reduce(y)
    return final_norm(hidden, residual)


def maybe_inject_stall(rank: int, step: int) -> None:
    """Fault injection for the e2e fault-stop test: rank `r` sleeps on the host before its
    fused step `n` (eager steps only; a replayed graph does not call forward), so the other
    ranks wait in that step's first all-reduce and upstream's watchdog must stop them."""
    value = os.environ.get(STALL_ENV)
    if not value:
        return
    r, n, seconds = value.split(":")
    if int(r) == rank and int(n) == step:
        time.sleep(float(seconds))
