"""Step buffers shared by every fused layer of one model.

The layers of a model run one at a time on one stream, and a layer's scratch (split-K
partials, attention partials, indexer scores, MoE activations) is dead once its step ends; its
outputs (y, the residual, the top-k) are read by the next layer, which reads each before it
writes the same buffer (y and the residual by its first kernel; the top-k only when it has no
indexer, and then it writes no top-k). So one buffer per name, as large as the largest layer
asks for, serves them all: for GLM-5.3 at 16 rows and a long context that is tens of MB per
GPU instead of about a GB (78 layers, each with its own attention partials and, for indexer
layers, scores as wide as the context).

A ``zeroed`` buffer starts at zero and every layer that writes it leaves it at zero again
before its step ends (the scores' first-digit histograms, which the top-k clears), so it too
can be shared.

Layers ``request`` their buffers while they are built; ``finalize`` allocates each name once
and gives every layer its views. A layer's own buffers (a dense layer's preset slot table,
counters) are not requested here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch


@dataclass(frozen=True)
class Spec:
    shape: Tuple[int, ...]
    dtype: torch.dtype
    zeroed: bool = False  # allocated at zero (its users leave it so)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def allocate(specs: Dict[str, Spec], device) -> Dict[str, torch.Tensor]:
    """One tensor per spec: uninitialized, or at zero where the spec is ``zeroed``."""
    return {n: (torch.zeros if s.zeroed else torch.empty)(s.shape, dtype=s.dtype, device=device)
            for n, s in specs.items()}


class Workspace:
    def __init__(self, device):
        self.device = torch.device(device)
        self._requests: List[Tuple[object, Dict[str, Spec]]] = []
        self.flat: Dict[str, torch.Tensor] = {}

    def request(self, layer, specs: Dict[str, Spec]) -> None:
        """Register a layer's buffers; its ``buf`` gets their views at ``finalize``."""
        if self.flat:
            raise RuntimeError("workspace already finalized: build every layer first")
        self._requests.append((layer, dict(specs)))

    def finalize(self) -> None:
        """Allocate each name at its largest request and hand every layer its views."""
        sizes: Dict[str, Spec] = {}
        for _, specs in self._requests:
            for name, spec in specs.items():
                have = sizes.get(name)
                if have is not None and (have.dtype, have.zeroed) != (spec.dtype, spec.zeroed):
                    raise ValueError(f"workspace buffer {name!r} requested as {have.dtype} "
                                     f"(zeroed: {have.zeroed}) and {spec.dtype} (zeroed: "
                                     f"{spec.zeroed})")
                if have is None or spec.numel > have.numel:
                    sizes[name] = Spec((spec.numel,), spec.dtype, spec.zeroed)
        self.flat = allocate(sizes, self.device)
        for layer, specs in self._requests:
            layer.buf.update({n: self.flat[n][: s.numel].view(s.shape) for n, s in specs.items()})

    @property
    def nbytes(self) -> int:
        """Bytes allocated (after ``finalize``)."""
        return sum(t.numel() * t.element_size() for t in self.flat.values())

    @property
    def requested_bytes(self) -> int:
        """Bytes the layers would hold with a buffer each."""
        return sum(s.numel * s.dtype.itemsize for _, specs in self._requests
                   for s in specs.values())
