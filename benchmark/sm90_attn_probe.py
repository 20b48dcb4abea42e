"""The sparse attention alone: sm90 sparse_mla (CuTe DSL; 2 or 3 stages, 1 or 2 gathering
warpgroups, and its measurement-only forms: no_mma, the gather alone; no_load, the consumer
alone) against triton.mla's kernel, the same inputs, one TP8 rank's GLM-5.3 shapes (8 heads,
576-wide bf16 KV rows, 2048 top-k entries a row), at 1-16 rows. Each arm is a CUDA graph of 8 launches over 4
KV caches in turn (past the 60 MB L2 from 12 rows with --layout random), timed by CUDA events
(median of 20 replays); the floor is the KV rows' bytes over a device copy's bandwidth
measured in the run.

--layout: where a row's entries sit in the cache. random: 2048 of a 3000-token context, each
position's slot anywhere in the cache (every row a scattered 1152 bytes); paged: the same
picks (sorted), the slots in 64-slot pages placed anywhere (a paged server's table); layer:
a 2048-token context, every position picked, slots in order (the layer benchmarks' table).

    PYTHONPATH=python:sgl-kernel-ext python3 -m benchmark.sm90_attn_probe --out $OUT

--eager runs each arm three times without a graph or timing, for Nsight Compute (each kernel
alone and cold, as ncu serializes them and flushes the caches), e.g.

    ncu --clock-control none -k regex:'SparseMla|_sparse_attn' --section SpeedOfLight \
        --section WarpStateStats python3 -m benchmark.sm90_attn_probe --ms 1,16 --eager
"""

import argparse
import json
import math
import os
import time

import torch

from benchmark.harness import measure_bandwidth
from sgl_kernel_ext.nvidia.sm90 import sparse_mla
from sgl_kernel_ext.triton import mla

TOPK, WIDTH, HEADS, CONTEXT = 2048, 576, 8, 3000


def _inputs(rows, copies, seed, layout):
    g = torch.Generator(device="cuda").manual_seed(seed)
    context = CONTEXT if layout != "layer" else TOPK
    qcat = (torch.randn(rows, HEADS, WIDTH, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    topk = torch.stack([torch.randperm(context, device="cuda", generator=g)[:TOPK]
                        for _ in range(rows)]).to(torch.int64)
    if layout != "random":
        topk = topk.sort(dim=1).values
    caches, tables = [], []
    pages = -(-context // 64)
    for _ in range(copies):
        caches.append(torch.randn(rows * pages * 64, WIDTH, device="cuda", generator=g
                                  ).to(torch.bfloat16))
        if layout == "random":
            table = torch.randperm(rows * pages * 64, device="cuda", generator=g)
        elif layout == "paged":
            page = torch.randperm(rows * pages, device="cuda", generator=g)
            table = (page[:, None] * 64 + torch.arange(64, device="cuda")).flatten()
        else:
            table = torch.arange(rows * pages * 64, device="cuda")
        tables.append(table.view(rows, pages * 64)[:, :context].contiguous().to(torch.int32))
    return qcat, topk, caches, tables


def _time(fn, copies):
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(8):
            fn(i % copies)
    graph.replay()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 8)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", default="1,2,4,8,12,16")
    p.add_argument("--out", default="benchmark/results")
    p.add_argument("--eager", action="store_true", help="each arm 3 times, untimed (ncu)")
    p.add_argument("--layout", default="random", choices=("random", "paged", "layer"))
    args = p.parse_args()
    bw = 1.0 if args.eager else measure_bandwidth(torch.device("cuda"), 1 << 30)
    results = []
    for rows in [int(x) for x in args.ms.split(",")]:
        copies = 4
        qcat, topk, caches, tables = _inputs(rows, copies, rows, args.layout)
        splits = mla.attention_splits(rows, TOPK)
        part_o = torch.empty(rows, splits, HEADS, 512, device="cuda")
        part_ml = torch.empty(rows, splits, HEADS, 2, device="cuda")
        olat = torch.empty(rows, HEADS, 512, dtype=torch.bfloat16, device="cuda")
        scale = 1 / math.sqrt(192)
        arms = {
            "triton": lambda i: mla.sparse_attention(qcat, caches[i], topk, tables[i], scale,
                                                     part_o, part_ml, olat, 512, 64, merge=False),
        }
        for name, stages, ablate, gatherers in (
                ("sm90_2_stages", 2, "", 1), ("sm90_3_stages", 3, "", 1),
                ("sm90_2_gatherers", 2, "", 2), ("sm90_no_mma", 2, "no_mma", 1),
                ("sm90_2_gatherers_no_mma", 2, "no_mma", 2), ("sm90_no_load", 2, "no_load", 1)):
            arms[name] = (lambda i, st=stages, ab=ablate, g=gatherers:
                          sparse_mla.sparse_attention(qcat, caches[i], topk, tables[i], scale,
                                                      part_o, part_ml, stages=st, ablate=ab,
                                                      gatherers=g))
        if args.eager:
            for name, fn in arms.items():
                for i in range(3):
                    fn(i % copies)
                torch.cuda.synchronize()
                print("ran", name, rows, flush=True)
            continue
        floor = rows * TOPK * WIDTH * 2 / bw * 1e6
        row = {"rows": rows, "splits": splits, "floor_us": round(floor, 2)}
        for name, fn in arms.items():
            row[name + "_us"] = round(_time(fn, copies), 2)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.eager:
        return
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(args.out, f"sm90_attn_probe_{stamp}.json")
    with open(path, "w") as f:
        json.dump({"commit": os.environ.get("BENCH_COMMIT", ""), "bandwidth_Bps": bw,
                   "layout": args.layout,
                   "results": results}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
