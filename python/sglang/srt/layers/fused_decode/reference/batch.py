"""Which rows a step computes and where their context lives.

Every row is one new token of its own request: `positions[m]` is the token's position (its
context is positions 0..positions[m], the new token included) and `token_slots[m, j]` is the
cache slot of the request's position j (SGLang's req_to_token row). The new token is written at
`token_slots[m, positions[m]]` (SGLang's out_cache_loc). A pad row has position -1: it writes
nothing, reads nothing, and its outputs are not meaningful.

A decode step of M requests has M rows; a prefill of a prompt of T tokens has T rows sharing one
slot table, row t at position t (all rows write before any row reads, so row t sees 0..t).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class RowBatch:
    positions: torch.Tensor  # int64 [M], -1 for a pad row
    token_slots: torch.Tensor  # int64 [M, L_max]

    def __post_init__(self):
        assert self.positions.dim() == 1 and self.token_slots.dim() == 2
        assert self.token_slots.shape[0] == self.positions.shape[0]
        assert int(self.positions.max()) < self.token_slots.shape[1] if len(self.positions) else True

    @property
    def slot_table(self) -> torch.Tensor:
        """The table the kernels read slots from: token_slots here (row m is row m's)."""
        return self.token_slots

    @property
    def slot_rows(self):
        """Which slot_table row is row m's (int64 [M]); None: row m."""
        return None

    @property
    def num_rows(self) -> int:
        return self.positions.shape[0]

    @property
    def valid(self) -> torch.Tensor:
        return self.positions >= 0

    @property
    def seq_lens(self) -> torch.Tensor:
        """Context length per row (0 for a pad row)."""
        return self.positions + 1

    @property
    def out_slots(self) -> torch.Tensor:
        """The slot each row writes (-1 for a pad row)."""
        s = self.token_slots.gather(1, self.positions.clamp_min(0).unsqueeze(1)).squeeze(1)
        return torch.where(self.valid, s, torch.full_like(s, -1))

    @property
    def rope_positions(self) -> torch.Tensor:
        return self.positions.clamp_min(0)


def decode_batch(positions: Sequence[int], tables: Sequence[torch.Tensor], device="cpu") -> RowBatch:
    """M decode rows from per-request slot tables (a pad row: position -1, any table)."""
    width = max(int(t.numel()) for t in tables)
    slots = torch.full((len(tables), width), -1, dtype=torch.int64, device=device)
    for m, t in enumerate(tables):
        slots[m, : t.numel()] = t.to(device)
    return RowBatch(torch.tensor(list(positions), dtype=torch.int64, device=device), slots)


def prefill_batch(tables: Sequence[torch.Tensor], lengths: Sequence[int], device="cpu") -> RowBatch:
    """Rows for prompts of `lengths` tokens (prompt i's token t at tables[i][t]), concatenated."""
    width = max(int(t.numel()) for t in tables)
    pos, rows = [], []
    for t, n in zip(tables, lengths):
        assert n <= t.numel()
        pos.append(torch.arange(n, dtype=torch.int64))
        row = torch.full((width,), -1, dtype=torch.int64)
        row[: t.numel()] = t
        rows.append(row.expand(n, width))
    return RowBatch(torch.cat(pos).to(device), torch.cat(rows).to(device))
