"""Where the fused decode layer's time goes, per layer kind and rows (one TP8 rank, H200).

For each kind, COPIES layers with distinct weights run back to back (so the 60 MB L2 cannot
serve the weights between replays); the whole sequence is captured in one CUDA graph and
replayed (median), and the same sequence runs eagerly under the torch profiler to give each
kernel's device time. Reports per layer: graph us, floor us (roofline bytes over the copy
bandwidth measured in this run), fraction of the floor, and the kernel table.

    PYTHONPATH=python:sgl-kernel-ext python benchmark/fused_stages.py --out DIR [--rows 1 4 16]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

import torch

from benchmark import roofline
from benchmark.harness import git_commit, measure_bandwidth, time_graph
from sglang.srt.layers.fused_decode.layer import FusedLayer
from sglang.srt.layers.fused_decode.reference.config import glm53_config
from sglang.srt.layers.fused_decode.reference.weights import gen_layer
from sglang.srt.layers.fused_decode.testing import make_case

KINDS = {"dense": 0, "moe_idx": 6, "moe": 4}  # roofline kind -> a layer id of that kind


def profile_kernels(fn, copies: int):
    """({kernel: device us per layer}, launches per layer) of one eager run of fn."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per_kernel, launches = defaultdict(float), 0
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[ev.key] += ev.device_time_total / copies
            launches += ev.count
    return dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])), launches / copies


def run(rows_list, context, copies, out_dir):
    cfg = glm53_config()
    bw = measure_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    results = []
    for kind, lid in KINDS.items():
        t0 = time.time()
        weights = [gen_layer(cfg, seed, lid, tp_size=8, tp_rank=0, device="cuda")
                   for seed in range(copies)]
        print(f"{kind}: {copies} weight copies in {time.time() - t0:.1f} s", flush=True)
        for rows in rows_list:
            cases = [make_case(cfg, lid, [context] * rows, seed=i, device="cuda", lw=w)
                     for i, w in enumerate(weights)]
            layers = [FusedLayer(cfg, c.lw, c.caches, rows, context) for c in cases]

            def step():
                for layer, c in zip(layers, cases):
                    layer(c.hidden, c.residual, c.batch, c.topk_prev)

            step()
            median_us, _ = time_graph(step, replays=50)
            us = median_us / copies
            nbytes = roofline.layer_bytes(kind, 8, rows, context)
            floor = roofline.floor_us(nbytes, bw)
            kernels, launches = profile_kernels(step, copies)
            r = {"kind": kind, "layer_id": lid, "rows": rows, "context": context, "arm": "fused",
                 "us": us, "floor_us": floor, "fraction_of_floor": floor / us,
                 "bytes": nbytes, "achieved_tbps": nbytes / us / 1e6,
                 "kernel_us": kernels, "kernel_us_sum": sum(kernels.values()),
                 "launches_per_layer": launches}
            results.append(r)
            print(f"{kind} M={rows}: {us:.1f} us, floor {floor:.1f} us "
                  f"({100 * floor / us:.0f}%), kernels sum {r['kernel_us_sum']:.1f} us", flush=True)
            for name, t in list(kernels.items())[:12]:
                print(f"    {t:8.2f} us  {name[:90]}")
            del cases, layers
            torch.cuda.empty_cache()
        del weights
        torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5MEGA_COMMIT") or git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "copy_bandwidth_bytes_per_s": bw,
            "copies": copies}
    with open(f"{out_dir}/fused_stages.json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print("\n| kind | M | fused us | floor us | % of floor |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['kind']} | {r['rows']} | {r['us']:.1f} | {r['floor_us']:.1f} | "
              f"{100 * r['fraction_of_floor']:.0f}% |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--copies", type=int, default=4)
    a = p.parse_args()
    run(a.rows, a.context, a.copies, a.out)


if __name__ == "__main__":
    main()
