"""The two decode caches, laid out as SGLang's CUDA DSA pool holds them, read and written at slots.

- Latent KV cache, one per layer: [num_slots, kv_lora + rope] (bf16 in SGLang's default on H200;
  SGLang's buffer is [num_slots, 1, 576]). Row = RMS-normed latent c_kv, then the roped k_pe.
- Index-K cache, one per 'full' layer: uint8 [num_pages, 64 * 132]; a page holds its 64 tokens'
  e4m3 keys (64 x 128 B) and then their fp32 scales (64 x 4 B). Slot s lives in page s // 64 at
  offset s % 64.

Slots are token-level indices into both (the KV pool's 64-token pages are the same slots).
A slot < 0 marks a pad row: nothing is written for it and nothing is read through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional

import torch

from .config import INDEX_PAGE_SIZE, Glm5Config
from .quant import FP8

INDEX_KEY_BYTES = 128
INDEX_SCALE_BYTES = 4
INDEX_PAGE_BYTES = INDEX_PAGE_SIZE * (INDEX_KEY_BYTES + INDEX_SCALE_BYTES)


@dataclass
class Caches:
    kv: Dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [num_slots, kv_cache_dim]
    index: Dict[int, torch.Tensor] = field(default_factory=dict)  # full layer -> uint8 pages

    @property
    def num_slots(self) -> int:
        return next(iter(self.kv.values())).shape[0]


def alloc_caches(
    cfg: Glm5Config,
    num_slots: int,
    device="cpu",
    kv_dtype=torch.bfloat16,
    layers: Optional[Iterable[int]] = None,
    poison: bool = False,
) -> Caches:
    """Caches for `layers` (default all). `poison` fills them with NaN (bytes 0xFF) instead of
    zeros, so a read of a slot nobody wrote shows up in the output."""
    if num_slots % INDEX_PAGE_SIZE:
        raise ValueError(f"num_slots={num_slots} is not a multiple of the {INDEX_PAGE_SIZE}-token page")
    c = Caches()
    for i in range(cfg.num_hidden_layers) if layers is None else layers:
        kv = torch.empty(num_slots, cfg.kv_cache_dim, dtype=kv_dtype, device=device)
        kv.fill_(float("nan") if poison else 0.0)
        c.kv[i] = kv
        if cfg.runs_indexer(i):
            pages = num_slots // INDEX_PAGE_SIZE
            c.index[i] = torch.full(
                (pages, INDEX_PAGE_BYTES), 0xFF if poison else 0, dtype=torch.uint8, device=device
            )
    return c


def write_kv(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    ok = slots >= 0
    cache[slots[ok]] = rows[ok].to(cache.dtype)


def gather_kv(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """fp32 rows at `slots` (any shape); rows for slots < 0 are zero."""
    ok = slots >= 0
    rows = cache[slots.clamp_min(0)].to(torch.float32)
    return torch.where(ok.unsqueeze(-1), rows, torch.zeros((), device=rows.device))


def _index_views(cache: torch.Tensor):
    pages = cache.shape[0]
    keys = cache[:, : INDEX_PAGE_SIZE * INDEX_KEY_BYTES].view(pages, INDEX_PAGE_SIZE, INDEX_KEY_BYTES)
    scales = cache[:, INDEX_PAGE_SIZE * INDEX_KEY_BYTES :].view(torch.float32)  # [pages, 64]
    return keys, scales


def write_index(cache: torch.Tensor, slots: torch.Tensor, k8: torch.Tensor, scale: torch.Tensor) -> None:
    """Store e4m3 keys k8 [M, 128] and fp32 scales [M] at token slots [M] (slots < 0 skipped)."""
    ok = slots >= 0
    s = slots[ok]
    keys, scales = _index_views(cache)
    keys[s // INDEX_PAGE_SIZE, s % INDEX_PAGE_SIZE] = k8[ok].view(torch.uint8)
    scales[s // INDEX_PAGE_SIZE, s % INDEX_PAGE_SIZE] = scale[ok].to(torch.float32)


def gather_index(cache: torch.Tensor, slots: torch.Tensor):
    """(keys fp32 [..., 128] as e4m3 values, scales fp32 [...]) at `slots`; zero where slot < 0."""
    ok = slots >= 0
    s = slots.clamp_min(0)
    keys, scales = _index_views(cache)
    k = keys[s // INDEX_PAGE_SIZE, s % INDEX_PAGE_SIZE].view(FP8).to(torch.float32)
    sc = scales[s // INDEX_PAGE_SIZE, s % INDEX_PAGE_SIZE]
    zero = torch.zeros((), device=k.device)
    return torch.where(ok.unsqueeze(-1), k, zero), torch.where(ok, sc, zero)


def fill_random(caches: Caches, seed: int = 0) -> None:
    """Fill every slot of every cache with random rows of realistic scale (unit-RMS KV rows;
    e4m3 index keys with scales ~1/448), to stand in for a long prefilled context in benchmarks."""
    from .rng import uniform  # local: only benchmarks need it

    for layer, kv in caches.kv.items():
        dev = kv.device
        kv.copy_(uniform(seed, f"kv.{layer}", list(kv.shape), device=dev) * 3**0.5)
    for layer, ix in caches.index.items():
        dev = ix.device
        n = ix.shape[0] * INDEX_PAGE_SIZE
        slots = torch.arange(n, device=dev)
        k8 = (uniform(seed, f"ixk.{layer}", [n, INDEX_KEY_BYTES], device=dev) * 448).to(FP8)
        sc = (1.0 + 0.25 * uniform(seed, f"ixs.{layer}", [n], device=dev)) / 448
        write_index(ix, slots, k8, sc)
