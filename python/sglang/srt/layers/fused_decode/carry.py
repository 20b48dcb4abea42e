"""The MTP draft's DSA top-k carried across its draft-decode iterations, for the fused layer.

Under the config's ``index_share_for_mtp_iteration`` (EAGLE top-k 1) upstream's draft loop
carries one top-k across its iterations in ``spec_info.dsa_topk_indices`` (the step's
``reuse_dsa_topk_indices`` is set): the first iteration attends the seed that draft-extend left
there (the draft layer's top-k at each request's last accepted row) or, with no seed, runs its
indexer and publishes that top-k; every later iteration attends it with its indexer skipped
whole (no index-K row written, no scores).

Upstream's top-k reaches the fused draft in upstream's index space: physical KV slots (token
slots of the pool) when the DSA backend's fused top-k is on (``use_fused_topk``, upstream's
default), else context positions of the row's request; -1 padded, in no particular order. The
fused layer attends context positions, ascending, -1 padded. ``TopkCarry.take`` converts the
seed into the draft layer's own top-k buffer, and the step publishes that buffer as the carry,
so later iterations find it there and attend it as is (``holds``).

Slots to positions: with 64-token pages, slot s of a request sits at position 64 j + s % 64,
where j is the request's logical page whose physical page is s // 64 (upstream's paged allocator
lays requests out so; its DSA backend derives page tables the same way). Each row's physical
pages (those of its context; the rest masked) are sorted and the seed's pages looked up in
them; a slot whose page is not in the row's context, whose position's table entry is not that
slot, or which lands past the row's own position, is dropped (-1). Every op writes into
buffers allocated at build (but for the few reads of a server's pool table,
``runtime.StepRows``): no host sync, capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Optional

import torch

from .reference.batch import RowBatch
from .reference.config import INDEX_PAGE_SIZE

PAGE = INDEX_PAGE_SIZE  # tokens per KV page (spec.SERVED_PAGE_SIZE)
SLOTS, POSITIONS = "slots", "positions"  # upstream's index spaces of a carried top-k
_BIG = torch.iinfo(torch.int64).max


def _prefix(buf: torch.Tensor, *shape: int) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    return buf.view(-1)[:n].view(*shape)


class TopkCarry:
    """Conversion buffers for a draft layer whose top-k buffer is `out` [max_rows, k] int64,
    over tables of up to `max_context` positions."""

    def __init__(self, out: torch.Tensor, max_context: int):
        if out.dtype != torch.int64 or out.dim() != 2 or not out.is_contiguous():
            raise ValueError("the carry lives in the layer's int64 [rows, k] top-k buffer")
        rows, k = out.shape
        pages = -(-max_context // PAGE)
        dev = out.device
        e = lambda *s, dt=torch.int64: torch.empty(*s, dtype=dt, device=dev)  # noqa: E731
        self.out, self.k, self.max_pages = out, k, pages
        self.page_start = torch.arange(pages, dtype=torch.int64, device=dev) * PAGE
        self.buf = dict(keys=e(rows, pages), sorted=e(rows, pages), order=e(rows, pages),
                        in_ctx=e(rows, pages, dt=torch.bool), seed=e(rows, k), q=e(rows, k),
                        idx=e(rows, k), found=e(rows, k), pos=e(rows, k),
                        hit=e(rows, k, dt=torch.bool), ok=e(rows, k, dt=torch.bool))

    def holds(self, topk: Optional[torch.Tensor]) -> bool:
        """Whether `topk` is this carry (published by an earlier iteration: positions)."""
        return (topk is not None and topk.dtype == torch.int64
                and topk.data_ptr() == self.out.data_ptr())

    def published(self, m: int) -> torch.Tensor:
        """The carry of an m-row step: the layer's top-k buffer's first m rows."""
        return self.out[:m]

    def take(self, seed: torch.Tensor, batch: RowBatch, space: str) -> torch.Tensor:
        """`seed` (upstream's carried top-k [>= m, k], in `space`) as ascending context
        positions, -1 padded, in the carry's first m rows (returned)."""
        m = batch.num_rows
        if seed.dim() != 2 or seed.shape[0] < m or seed.shape[1] != self.k:
            raise ValueError(f"a carried top-k of shape {tuple(seed.shape)} for {m} rows; the "
                             f"draft layer attends {self.k} per row")
        if self.holds(seed):
            return self.published(m)
        b = {n: _prefix(self.buf[n], m, self.k)
             for n in ("seed", "q", "idx", "found", "pos", "hit", "ok")}
        pos = batch.positions.unsqueeze(1)
        s = b["seed"]
        s.copy_(seed[:m])
        if space == SLOTS:
            self._slots_to_positions(s, batch, b)
        elif space == POSITIONS:
            b["pos"].copy_(s)
            torch.ge(s, 0, out=b["hit"])
        else:
            raise ValueError(f"unknown index space {space!r}")
        torch.le(b["pos"], pos, out=b["ok"])  # nothing past the row's own position
        b["hit"].logical_and_(b["ok"])
        b["pos"].masked_fill_(b["hit"].logical_not_(), _BIG)
        out = self.published(m)
        torch.sort(b["pos"], dim=1, out=(out, b["idx"]))
        torch.eq(out, _BIG, out=b["hit"])
        out.masked_fill_(b["hit"], -1)
        return out

    def _slots_to_positions(self, s: torch.Tensor, batch: RowBatch, b: dict) -> None:
        """b['pos'] = each slot's context position in its row, b['hit'] = found. Reads the
        batch's slot table where it is (a server's pool: each row's request row of it, only
        its pages' first slots and the looked-up ones)."""
        table, rows = batch.slot_table, batch.slot_rows
        m, width = batch.num_rows, table.shape[1]
        pages = -(-width // PAGE)
        if pages > self.max_pages:
            raise ValueError(f"a table of {width} positions; the carry was built for "
                             f"{self.max_pages * PAGE}")
        keys, srt, order, in_ctx = (_prefix(self.buf[n], m, pages)
                                    for n in ("keys", "sorted", "order", "in_ctx"))
        firsts = table[:, ::PAGE] if rows is None else table[:, ::PAGE].index_select(0, rows)
        torch.floor_divide(firsts, PAGE, out=keys)  # each logical page's physical one
        torch.le(self.page_start[:pages].unsqueeze(0), batch.positions.unsqueeze(1), out=in_ctx)
        keys.masked_fill_(in_ctx.logical_not_(), _BIG)
        torch.sort(keys, dim=1, out=(srt, order))
        q, idx, found, pos = b["q"], b["idx"], b["found"], b["pos"]
        torch.floor_divide(s, PAGE, out=q)
        torch.searchsorted(srt, q, out=idx)
        idx.clamp_(max=pages - 1)
        torch.gather(srt, 1, idx, out=found)
        torch.eq(found, q, out=b["hit"])  # a -1 pad's page (-1) is never a row's page
        torch.gather(order, 1, idx, out=pos)
        pos.mul_(PAGE)
        torch.remainder(s, PAGE, out=q)
        pos.add_(q)
        # the position's own slot must be s (upstream's paged layout guarantees it; a table that
        # breaks it drops the slot rather than attend another token)
        torch.clamp(pos, 0, width - 1, out=idx)
        if rows is None:
            torch.gather(table, 1, idx, out=found)
        else:
            found.copy_(table[rows.unsqueeze(1), idx])
        torch.eq(found, s, out=b["ok"])
        b["hit"].logical_and_(b["ok"])
