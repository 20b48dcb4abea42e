"""A small engine over the reference: requests with scattered cache slots, prefill, greedy decode.

Slots are handed out from a seeded shuffle of the pool, so a request's tokens land on many
64-token pages and next to other requests' tokens, as in SGLang's paged pool. Caches start
poisoned (NaN) by default: a read of a slot nobody wrote turns the logits into NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from .batch import decode_batch, prefill_batch
from .cache import alloc_caches
from .config import Glm5Config
from .model import Reduce, as_ranks, forward_rows, sum_partials
from .quant import SGLANG, Numerics


@dataclass
class Request:
    rid: int
    tokens: List[int]  # prompt + generated tokens so far
    slots: torch.Tensor  # slot of each position (capacity entries)
    cached: int = 0  # positions already in the caches


@dataclass
class ReferenceEngine:
    cfg: Glm5Config
    weights: object  # ModelWeights or a list of TP ranks
    num_slots: int = 1024
    device: str = "cpu"
    num: Numerics = SGLANG
    reduce: Reduce = sum_partials
    seed: int = 0
    poison: bool = True
    requests: Dict[int, Request] = field(default_factory=dict)

    def __post_init__(self):
        self.ranks = as_ranks(self.weights)
        self.caches = alloc_caches(self.cfg, self.num_slots, self.device, self.num.act_dtype
                                   if self.num.act_dtype == torch.float32 else torch.bfloat16,
                                   layers=sorted(self.ranks[0].layers), poison=self.poison)
        g = torch.Generator().manual_seed(self.seed)
        self._free = torch.randperm(self.num_slots, generator=g).tolist()

    def add_request(self, prompt: Sequence[int], capacity: int) -> int:
        if capacity > len(self._free):
            raise RuntimeError(f"out of cache slots: need {capacity}, {len(self._free)} free")
        rid = len(self.requests)
        slots = torch.tensor([self._free.pop() for _ in range(capacity)], dtype=torch.int64)
        self.requests[rid] = Request(rid, list(prompt), slots)
        return rid

    def prefill(self, rids: Sequence[int], dense: bool = False) -> List[torch.Tensor]:
        """Run the uncached prompt of each request (must start at position 0): logits per token.
        `dense` attends to whole prefixes (SGLang's short-context prefill)."""
        reqs = [self.requests[r] for r in rids]
        assert all(r.cached == 0 for r in reqs), "prefill starts a request from position 0"
        batch = prefill_batch([r.slots for r in reqs], [len(r.tokens) for r in reqs], self.device)
        ids = torch.tensor([t for r in reqs for t in r.tokens], dtype=torch.int64, device=self.device)
        logits = forward_rows(self.cfg, self.ranks, ids, batch, self.caches, self.num, self.reduce,
                              dense)
        for r in reqs:
            r.cached = len(r.tokens)
        return list(logits.split([len(r.tokens) for r in reqs]))

    def decode(self, rids: Sequence[Optional[int]], tokens: Sequence[int]) -> torch.Tensor:
        """One step: row m appends tokens[m] to request rids[m] (None: a pad row). Logits [M, V]."""
        positions, tables = [], []
        for rid, tok in zip(rids, tokens):
            if rid is None:
                positions.append(-1)
                tables.append(torch.full((1,), -1, dtype=torch.int64))
                continue
            r = self.requests[rid]
            assert r.cached == len(r.tokens), "decode follows prefill of the whole sequence"
            r.tokens.append(int(tok))
            positions.append(r.cached)
            tables.append(r.slots)
            r.cached += 1
        batch = decode_batch(positions, tables, self.device)
        ids = torch.tensor([t if r is not None else 0 for r, t in zip(rids, tokens)],
                           dtype=torch.int64, device=self.device)
        return forward_rows(self.cfg, self.ranks, ids, batch, self.caches, self.num, self.reduce)

    def generate(self, prompts: Sequence[Sequence[int]], steps: int, pad_rows: int = 0):
        """Prefill the prompts, then `steps` greedy decode steps of all requests at once (plus
        `pad_rows` pad rows). Returns (rids, first tokens, per-step decode logits [M, V])."""
        rids = [self.add_request(p, len(p) + steps + 1) for p in prompts]
        first = [int(l[-1].argmax()) for l in self.prefill(rids)]
        tokens, step_logits = list(first), []
        for _ in range(steps):
            logits = self.decode(rids + [None] * pad_rows, tokens + [0] * pad_rows)[: len(rids)]
            step_logits.append(logits)
            tokens = [int(t) for t in logits.argmax(dim=-1)]
        return rids, first, step_logits
