"""Probe: tilings of the small-M MoE kernels (gate/up + SwiGLU, down + combine) on one TP8
rank's real expert shapes (256 experts of [2 x 256, 6144] and [6144, 256] FP8), against the
HBM floor of the experts each call touches.

Each timed call routes its rows to experts of its own (random top-8 per row), so successive
calls in the CUDA graph do not find their weights in L2.

    PYTHONPATH=python:sgl-kernel-ext python3 -m benchmark.moe_probe --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from sgl_kernel_ext.triton import moe

from .gemv_probe import graph_time

E, I, H, TOPK = 256, 256, 6144, 8
GATE_UP_TILINGS = [(16, 4, 4), (32, 2, 4), (32, 4, 2), (64, 2, 4), (64, 2, 2), (32, 2, 1),
                   (64, 2, 1), (16, 4, 1), (128, 2, 1)]
DOWN_TILINGS = [(64, 4), (32, 4), (128, 4), (128, 8), (16, 4)]


def tables(m: int, gen: torch.Generator, dev: str):
    """slot_expert, slot_weight, slot_rank, num_slots, slots used for m rows routed at random."""
    choice = torch.stack([torch.randperm(E, generator=gen)[:TOPK] for _ in range(m)]).sort(1).values
    experts = torch.unique(choice)
    slots = len(experts) + 1
    cap = m * TOPK + 1
    slot_expert = torch.full((cap,), 0, dtype=torch.int32)
    slot_expert[0] = E
    slot_expert[1:slots] = experts.int()
    weight = torch.zeros(cap, m)
    rank = torch.full((cap, m), -1, dtype=torch.int32)
    weight[0], rank[0] = 1.0, 0
    for r in range(m):
        for j, e in enumerate(choice[r].tolist()):
            s = 1 + int((experts == e).nonzero())
            weight[s, r] = 0.1 + 0.01 * j
            rank[s, r] = j + 1
    return (slot_expert.to(dev), weight.to(dev), rank.to(dev),
            torch.tensor([slots], dtype=torch.int32, device=dev), slots)


def _timed(results: dict, run, calls: int, nbytes: float, label: str, **fields) -> None:
    """Time run(i) over the calls in one graph; record and print us and TB/s (or the error)."""
    try:
        t = graph_time(run, calls)
    except Exception as exc:  # noqa: BLE001 - report the configuration and go on
        print(f"{label}: {type(exc).__name__}: {exc}")
        return
    results["rows"].append(dict(fields, us=t, bytes=nbytes, TBps=nbytes / t / 1e6))
    print(f"{label} {t:7.2f} us {nbytes / t / 1e6:5.2f} TB/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator().manual_seed(0)
    gu = torch.randn(E, 2 * I, H, device=dev).to(torch.float8_e4m3fn)
    gu_s = torch.rand(E, 2 * I // 128, H // 128, device=dev) + 0.5
    dq = torch.randn(E, H, I, device=dev).to(torch.float8_e4m3fn)
    ds = torch.rand(E, H // 128, I // 128, device=dev) + 0.5
    sgu = torch.randn(2 * I, H, device=dev).to(torch.float8_e4m3fn)
    sgu_s = torch.rand(2 * I // 128, H // 128, device=dev) + 0.5
    sdq = torch.randn(H, I, device=dev).to(torch.float8_e4m3fn)
    sds = torch.rand(H // 128, I // 128, device=dev) + 0.5
    results = {"rows": []}
    for m in map(int, args.ms.split(",")):
        calls = [tables(m, gen, dev) for _ in range(args.calls)]
        xq = torch.randn(m, H, device=dev).to(torch.float8_e4m3fn)
        sx = torch.rand(m, H // 128, device=dev) + 0.5
        pos = torch.arange(m, device=dev) + 100
        cap = m * TOPK + 1
        act = torch.randn(cap, m, I, device=dev).to(torch.bfloat16)
        terms = torch.empty(m, TOPK + 1, H, dtype=torch.bfloat16, device=dev)
        out = torch.empty(m, H, dtype=torch.bfloat16, device=dev)
        mean_slots = sum(c[4] for c in calls) / len(calls)
        gu_bytes = mean_slots * 2 * I * H
        down_bytes = mean_slots * H * I
        for tiling in GATE_UP_TILINGS:
            bn, g, sk = tiling
            parts = torch.empty(sk, cap, m, 2, I, device=dev) if sk > 1 else None
            for nw in (4, 8):
                def run(i):
                    se, _, _, ns, _ = calls[i]
                    moe.gate_up(xq, sx, E, se, ns, gu[:, :I], gu_s[:, : I // 128], gu[:, I:],
                                gu_s[:, I // 128:], sgu[:I], sgu_s[: I // 128], sgu[I:],
                                sgu_s[I // 128:], act, parts, tiling=tiling, num_warps=nw)
                _timed(results, run, len(calls), gu_bytes,
                       f"gate_up m={m:2d} slots={mean_slots:5.1f} {str(tiling):14s} w{nw}",
                       kernel="gate_up", m=m, tiling=tiling, num_warps=nw, slots=mean_slots)
        for bn, nw in DOWN_TILINGS:
            def run(i):
                se, sw, sr, ns, _ = calls[i]
                moe.down(act, E, se, sw, sr, ns, dq, ds, sdq, sds, pos, terms, out,
                         block_n=bn, num_warps=nw)
            _timed(results, run, len(calls), down_bytes,
                   f"down    m={m:2d} slots={mean_slots:5.1f} bn={bn:3d} w{nw}",
                   kernel="down", m=m, block_n=bn, num_warps=nw, slots=mean_slots)
    with open(os.path.join(args.out, "moe_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
