"""The fused path's build at load, before the KV cache is sized.

``build_plan`` takes one rank's layer weights (views of the loaded parameters, made by the
model package: the target's decoder layers, or the MTP draft's one decoder layer, which is
built the same way under its reference id ``num_hidden_layers``), builds one ``FusedLayer`` per
decoder layer for the widest covered step, and
counts what that costs per GPU: the derived weight copies (the indexer's bf16
[wk; weights_proj], made by the layer) and the step buffers, which the layers share
(``workspace``: one runs at a time). The KV pool does not exist yet at
load, so the layers are built against empty placeholder caches; ``bind_caches`` points them
at upstream's pool on the first covered step (a host-only rebinding, stable afterwards).

A step is covered when its forward mode and row count are in ``widths`` (``spec.covered_widths``):
that decision is host-only and fixed per CUDA-graph bucket.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .reference.cache import INDEX_PAGE_BYTES, Caches
from .reference.config import Glm5Config
from .reference.weights import LayerWeights
from .workspace import Workspace

logger = logging.getLogger(__name__)

MiB = 1 << 20


def _bytes(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass
class Plan:
    cfg: Glm5Config
    widths: Dict[str, Tuple[int, ...]]
    layer_ids: List[int]
    layers: list  # FusedLayer per entry of layer_ids
    max_rows: int
    max_context: int
    derived_bytes: int = 0
    buffer_bytes: int = 0
    bound: Optional[Caches] = field(default=None, repr=False)
    role: str = "target"  # or "MTP draft" (one layer: the draft's decoder layer)

    def covers(self, mode: Optional[str], rows: int) -> bool:
        """The branch rule: host values only (the forward mode's name and the row count)."""
        return mode is not None and rows in self.widths.get(mode, ())

    def describe(self) -> str:
        parts = [f"{mode} {_ranges(w)}" for mode, w in self.widths.items() if w]
        n = len(self.layers)
        return (f"fused decode covers {'; '.join(parts) or 'no step'} rows on {n} {self.role} "
                f"layer{'s' if n != 1 else ''}; derived weight copies "
                f"{self.derived_bytes / MiB:.1f} MiB and step buffers "
                f"{self.buffer_bytes / MiB:.1f} MiB per GPU")


def _ranges(widths: Sequence[int]) -> str:
    w = sorted(widths)
    if w == list(range(w[0], w[-1] + 1)) and len(w) > 2:
        return f"{w[0]}-{w[-1]}"
    return "/".join(map(str, w))


def placeholder_caches(cfg: Glm5Config, layer_ids: Sequence[int], device) -> Caches:
    """Empty caches of the pool's dtypes, for building layers before the pool exists."""
    c = Caches()
    for i in layer_ids:
        c.kv[i] = torch.empty(0, cfg.kv_cache_dim, dtype=torch.bfloat16, device=device)
        if cfg.runs_indexer(i):
            c.index[i] = torch.empty(0, INDEX_PAGE_BYTES, dtype=torch.uint8, device=device)
    return c


def build_plan(cfg: Glm5Config, weights: Sequence[LayerWeights],
               widths: Dict[str, Tuple[int, ...]], max_context: int,
               layer_cls: Optional[Callable] = None, rank: int = 0,
               role: str = "target") -> Plan:
    """Build every layer for the widest covered step; rank 0 logs the widths and memory.
    ``role`` names the model in the log: the target's layers, or the MTP draft's one layer
    (``weights`` then holds the draft layer, ``layer_id == cfg.num_hidden_layers``)."""
    from .layer import chain_prefetch  # needs sgl_kernel_ext

    if layer_cls is None:
        from .layer import FusedLayer as layer_cls
    max_rows = max((w for ws in widths.values() for w in ws), default=0)
    if not max_rows:
        raise ValueError("no covered width: nothing to build")
    ids = [lw.layer_id for lw in weights]
    device = weights[0].attn.q_a.q.device
    caches = placeholder_caches(cfg, ids, device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    ws = Workspace(device)
    layers = [layer_cls(cfg, lw, caches, max_rows, max_context, workspace=ws) for lw in weights]
    ws.finalize()
    sharded = [lw.layer_id for lw, layer in zip(weights, layers)
               if getattr(layer, "persistent", False) and getattr(layer, "sharded", False)]
    if sharded:
        raise ValueError(f"the persistent one-launch layer (SGL_KERNEL_EXT_PERSISTENT=1) has no "
                         f"TP all-reduce inside its launch, and layers {sharded} are TP shards: "
                         "unset it to serve TP > 1")
    chain_prefetch(layers)
    plan = Plan(cfg, dict(widths), ids, layers, max_rows, max_context, role=role)
    storages = {}  # the step buffers, each storage once (the workspace's are shared)
    for layer in layers:
        plan.derived_bytes += _bytes(getattr(layer, "wk_proj", None))
        for b in getattr(layer, "buf", {}).values():
            storages[b.untyped_storage().data_ptr() or id(b)] = b.untyped_storage().nbytes()
    plan.buffer_bytes = sum(storages.values())
    if before is not None:
        counted = plan.derived_bytes + plan.buffer_bytes
        grown = torch.cuda.memory_allocated(device) - before
        if grown > counted * 1.05 + MiB:
            logger.warning("fused decode build allocated %.1f MiB, %.1f MiB more than counted",
                           grown / MiB, (grown - counted) / MiB)
    if rank == 0:
        logger.info(plan.describe())
    return plan


def bind_caches(plan: Plan, caches: Caches) -> None:
    """Point every layer at upstream's pool (views of its buffers, no copy)."""
    if plan.bound is caches:
        return
    for layer in plan.layers:
        layer.bind_caches(caches)
    plan.bound = caches
