"""Where the fused layer's time goes inside its CUDA graph, with the overlap on.

``fused_stages`` times each kernel eagerly with the overlap off: a kernel's own duration,
not its share of the step. Here the layer runs as it is served (the stage kernels in a CUDA
graph, programmatic dependent launch on), and the profiler's device timestamps of graph
replays give, for each kernel of the chain, how much later it ends than the kernel before
it ("adds": its share of the critical path; the adds of a layer sum to its time), its
start relative to that end (negative: it was launched early and prefetched or waited), and
its duration. Medians over the replays and over COPIES layers with distinct weights.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.graph_timeline --out DIR \
        [--kinds moe --rows 1 2 16] [--variant NAME: one of tiling_probe's VARIANTS]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmark import roofline
from benchmark.harness import experts_touched, measure_bandwidth, pool_batch, run_meta
from sglang.srt.layers.fused_decode.layer import FusedLayer
from sglang.srt.layers.fused_decode.reference.config import glm53_config
from sglang.srt.layers.fused_decode.reference.weights import gen_layer
from sglang.srt.layers.fused_decode.testing import make_case

KINDS = {"dense": 0, "moe_idx": 6, "moe": 4}  # roofline kind -> a layer id of that kind


def _short(name: str) -> str:
    return name.split("(")[0].split("<")[0].strip()[:48]


def kernel_spans(graph, replays: int):
    """[(name, start us, end us)] of every kernel the replays ran, in start order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    spans = [(_short(e.name), e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(spans, key=lambda s: s[1])


def chain_table(spans, per_layer: int, copies: int):
    """Per kernel position of a layer: name, median adds / start-after-previous-end / duration
    (us), over every layer instance after the first of a replay."""
    rows = []
    for i in range(per_layer):
        adds, starts, durs, names = [], [], [], set()
        for j in range(per_layer + i, len(spans), per_layer):
            name, s, e = spans[j]
            prev_end = spans[j - 1][2]
            names.add(name)
            adds.append(e - prev_end)
            starts.append(s - prev_end)
            durs.append(e - s)
        rows.append({"name": "/".join(sorted(names)), "adds_us": statistics.median(adds),
                     "start_us": statistics.median(starts), "dur_us": statistics.median(durs)})
    return rows


def run(kinds, rows_list, context, copies, replays, out_dir, pool_width=0, pool_dtype="int32",
        variant="baseline"):
    cfg = glm53_config()
    bw = measure_bandwidth("cuda")
    results = []
    for kind in kinds:
        lid = KINDS[kind]
        weights = [gen_layer(cfg, seed, lid, tp_size=8, tp_rank=0, device="cuda")
                   for seed in range(copies)]
        for rows in rows_list:
            cases = [make_case(cfg, lid, [context] * rows, seed=i, device="cuda", lw=w)
                     for i, w in enumerate(weights)]
            layers = [FusedLayer(cfg, c.lw, c.caches, rows, context) for c in cases]
            batches = [pool_batch(c.batch, pool_width, getattr(torch, pool_dtype)) if pool_width
                       else c.batch for c in cases]

            def step():
                for layer, c, b in zip(layers, cases, batches):
                    layer(c.hidden, c.residual, b, c.topk_prev)

            step()
            torch.cuda.synchronize()
            touched = experts_touched(layers, rows)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
            spans = kernel_spans(g, replays)
            total = len(spans)
            if total % (replays * copies):
                raise RuntimeError(f"{total} kernels is not {replays} replays x {copies} layers")
            per_layer = total // (replays * copies)
            table = chain_table(spans, per_layer, copies)
            layer_us = sum(r["adds_us"] for r in table)
            floor = roofline.floor_us(roofline.layer_bytes(kind, 8, rows, context), bw)
            # the floor of the experts these steps touched (``floor_us``: the expected number)
            floor_touched = roofline.floor_us(
                roofline.layer_bytes(kind, 8, rows, context, experts=touched), bw)
            results.append({"kind": kind, "rows": rows, "context": context,
                            "pool_width": pool_width, "pool_dtype": pool_dtype,
                            "kernels_per_layer": per_layer, "layer_us": layer_us,
                            "floor_us": floor, "experts_touched": touched,
                            "floor_touched_us": floor_touched, "chain": table})
            print(f"{kind} M={rows}: {layer_us:.1f} us a layer (sum of adds), floor "
                  f"{floor:.1f} us ({floor_touched:.1f} for the experts touched: "
                  f"{touched}), {per_layer} kernels", flush=True)
            for r in table:
                print(f"    adds {r['adds_us']:6.2f}  start {r['start_us']:7.2f}  "
                      f"dur {r['dur_us']:6.2f}  {r['name']}")
            del cases, layers, g
            torch.cuda.empty_cache()
        del weights
        torch.cuda.empty_cache()
    # run_meta: the commit, the digest of the tree that ran (provenance.py), the GPU, versions
    meta = {"benchmark": "graph_timeline", **run_meta(torch.cuda.current_device()),
            "copy_bandwidth_bytes_per_s": bw, "copies": copies, "replays": replays,
            "variant": variant}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(out_dir, f"graph_timeline_{stamp}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print("wrote", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".")
    p.add_argument("--kinds", nargs="+", default=["moe"], choices=list(KINDS))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--pool-width", type=int, default=0,
                   help="read the slots from a server's pool table this wide (runtime.StepRows)")
    p.add_argument("--pool-dtype", default="int32", choices=["int32", "int64"])
    p.add_argument("--variant", default="baseline",
                   help="run with one of tiling_probe's VARIANTS' knob settings")
    a = p.parse_args()
    from benchmark import tiling_probe

    modules = tiling_probe.knob_modules()
    with tiling_probe.applied(a.variant, modules, tiling_probe.derived_values(modules)):
        run(a.kinds, a.rows, a.context, a.copies, a.replays, a.out, a.pool_width, a.pool_dtype,
            a.variant)


if __name__ == "__main__":
    main()
