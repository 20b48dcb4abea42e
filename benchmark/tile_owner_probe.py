"""Probe: can a few SMs, each owning whole 64-row tiles of q_a|kv_a (all of K, no split-K
partials to reduce across CTAs), stream it near the HBM floor?

attn_side's trace (its module docstring) puts c_q's split-K reduction on the critical path:
an atomic arrival, the last chunk's reload of the partials and a flag, ~3 us at one row. A
tile owned whole by one CTA would reduce in its own registers or shared memory instead, but
q_a|kv_a then has only 41 units for 132 SMs, so it pays only if an SM can pull its 393 KB at
~4x its fair share of HBM. This times fp8_mma (its K chunks, one CTA a unit) on the q_a|kv_a
matrix at one row with the default split over every SM, and with whole tiles (split 1) or
halves / thirds on 41 / 82 / 123 CTAs (one consumer warpgroup holding the whole ring, or two
a CTA on two half tiles), over weight copies that leave none in L2.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.tile_owner_probe --out $OUT

Measured on an H200 (results/tile_owner_probe_20261204T160730Z at 70e5e04, T161510Z at
3f039dc; floor 3.80 us), at 1 and 16 rows alike:

    K chunks x CTAs x warpgroups   6 x 132 x 2   3 x 123 x 1   2 x 82 x 1   2 x 41 x 2   1 x 41 x 1
    us                             7.1-7.3       7.2-7.4       9.2-9.5      15.8-15.9    14.8-15.6

i.e. ~3.7 us of fixed cost plus each CTA's bytes at ~35 GB/s, which is about 1/132 of HBM:
an SM does not stream faster when fewer share HBM, and a second consumer warpgroup on the
same SM adds nothing, so whole tiles on 41 SMs take twice the time and the split-K reduction
across SMs stays. Nor was it the consumer's scale loads (each slot's weight and x scales
loaded from global memory just before the slot is waited for): staged into shared memory at
each unit's start, all in flight together, every form was within 0.3 us (the `unit_scales`
arm at 3f039dc, T161510Z; not kept).
"""

from __future__ import annotations

import argparse

import torch

from benchmark.gemv_probe import graph_time, weight_copies
from benchmark.harness import measure_bandwidth, run_meta, write_json
from sgl_kernel_ext.nvidia.sm90 import fp8_mma

N, K = 2624, 6144  # q_a|kv_a of one GLM-5.3 rank


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = measure_bandwidth(dev)
    ws, ss, base = weight_copies(N, K, bw, dev)
    tiles = -(-N // 64)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    # (K chunks, CTAs, consumer warpgroups): the default, then tiles owned by fewer CTAs (two
    # consumer warpgroups a CTA each on its own half tile: 2 x tiles / 2)
    forms = [(fp8_mma.split_for(N, K), sms, 2), (3, min(3 * tiles, sms), 1), (2, 2 * tiles, 1),
             (2, tiles, 2), (1, tiles, 1)]
    rows = []
    print(f"bandwidth {bw / 1e12:.2f} TB/s; q_a|kv_a {N} x {K}: {base['bytes'] / 1e6:.1f} MB, "
          f"floor {base['floor_us']:.2f} us; {len(ws)} weight copies", flush=True)
    for m in map(int, args.ms.split(",")):
        xq = torch.randn(fp8_mma.x_rows(m), K, device=dev).to(torch.float8_e4m3fn)
        sx = torch.rand(m, K // 128, device=dev) + 0.5
        line = []
        for split, grid, groups in forms:
            parts = torch.empty(split, m, N, device=dev)
            us = graph_time(lambda i: fp8_mma.fp8_mma(xq, sx, ws[i], ss[i], parts, grid=grid,
                                                      groups=groups), len(ws))
            rows.append(dict(base, m=m, split=split, grid=grid, groups=groups, us=us,
                             frac_floor=base["floor_us"] / us,
                             per_sm_gb_s=base["bytes"] / min(grid, split * tiles) / us / 1e3))
            line.append(f"split {split} x {grid} CTAs x {groups} wg {us:6.2f} us "
                        f"({base['floor_us'] / us:4.0%})")
        print(f"m={m:2d}\n  " + "\n  ".join(line), flush=True)
    meta = run_meta(dev)
    meta.update(benchmark="tile_owner_probe", bandwidth_bytes_per_s=bw)
    write_json("tile_owner_probe", {"meta": meta, "results": rows}, [args.out])


if __name__ == "__main__":
    main()
