"""A driver for Nsight Compute: one real-shape GLM-5.3 layer (one TP8 rank, L = 2048) run
eagerly a few times at each row count, so ``ncu`` can read the hardware counters of its
kernels (achieved DRAM bandwidth, occupancy, warp stall reasons), which graph replay timing
cannot show. ncu serializes the kernels and flushes the caches before each by default: each
kernel is seen alone and cold, not overlapped as in the layer.

    ncu --clock-control none -k regex:'gate_up|down' -c 8 --section SpeedOfLight \\
        python3 -m benchmark.ncu_layer --kind moe --rows 1 16
"""

from __future__ import annotations

import argparse

import torch

from sglang.srt.layers.fused_decode.layer import FusedLayer
from sglang.srt.layers.fused_decode.reference.config import glm53_config
from sglang.srt.layers.fused_decode.reference.weights import gen_layer
from sglang.srt.layers.fused_decode.testing import make_case

KINDS = {"dense": 0, "moe_idx": 6, "moe": 4}  # a layer id of each kind


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", default="moe", choices=list(KINDS))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    cfg = glm53_config()
    lid = KINDS[args.kind]
    lw = gen_layer(cfg, 0, lid, tp_size=8, tp_rank=0, device="cuda")
    for rows in args.rows:
        case = make_case(cfg, lid, [args.context] * rows, seed=rows, device="cuda", lw=lw)
        layer = FusedLayer(cfg, case.lw, case.caches, rows, args.context)
        for run in range(args.runs):
            layer(case.hidden, case.residual, case.batch, case.topk_prev)
            torch.cuda.synchronize()
        print(f"{args.kind} rows={rows}: {args.runs} runs", flush=True)


if __name__ == "__main__":
    main()
