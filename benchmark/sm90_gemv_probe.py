"""Probe: the CuTe DSL FP8 linear (``nvidia.sm90.fp8_mma``: a TMA ring of weight tiles,
wgmma, K chunks; plain, and launched programmatically dependent with the weights streaming into
the ring before the wait) against the Triton stage kernel (``fp8_linear`` in the fused layer's
tiling, with and without programmatic dependent launch) on one decode layer's matrices at 1-16
rows, in the same run. Each arm writes its own K chunks (their consumer's sum is not timed).

Each arm is timed in a CUDA graph of back-to-back launches over enough weight copies that none
stays in L2 (``gemv_probe.graph_time``); the floor is the matrix's bytes over the measured copy
bandwidth. Sweeps fp8_mma's consumer warpgroups and, launched dependent, its ring depth;
``--hot`` adds both kernels on one weight copy (L2); ``--chain`` times the matrices as
one chain of dependent launches, a layer's linears in order.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.sm90_gemv_probe --out $OUT
"""

from __future__ import annotations

import argparse

import torch

from benchmark.gemv_probe import copy_bandwidth, graph_time, weight_copies
from benchmark.harness import run_meta, write_json
from sgl_kernel_ext.nvidia.sm90 import fp8_mma
from sgl_kernel_ext.triton import fp8_linear

SHAPES = {"o_proj": (6144, 2048), "q_a|kv_a": (2624, 6144), "q_b|wq_b": (6144, 2048),
          "9_experts_gate_up": (4608, 6144), "shared_down": (6144, 256)}


def chain(ms, stages: int, bw: float, dev) -> list:
    """The SHAPES matrices as one chain of dependent launches (a layer's linears in order),
    over weight copies that leave none in L2: Triton's fp8_linear (with its programmatic
    dependent launch and L2 prefetch, as in the layer) against fp8_mma (pdl, `stages`)."""
    mats = {name: weight_copies(n, k, bw, dev) for name, (n, k) in SHAPES.items()}
    copies = min(len(w) for w, _, _ in mats.values())
    floor = sum(row["floor_us"] for _, _, row in mats.values())
    copy_us = sum(row["copy_us"] for _, _, row in mats.values())
    out = []
    for m in ms:
        bufs = {}
        for name, (n, k) in SHAPES.items():
            xq = torch.randn(16, k, device=dev).to(torch.float8_e4m3fn)
            sx = torch.rand(m, k // 128, device=dev) + 0.5
            bn, groups, split = fp8_linear.tiling(n, k)
            bufs[name] = (xq, sx, (bn, groups), torch.empty(split, m, n, device=dev),
                          torch.empty(fp8_mma.split_for(n, k), m, n, device=dev))

        def triton_chain(i):
            for name, (xq, sx, (bn, groups), parts, _) in bufs.items():
                w, s, _ = mats[name]
                fp8_linear.fp8_linear(xq[:m], sx, w[i], s[i], parts, block_n=bn, groups=groups)

        def mma_chain(i):
            for name, (xq, sx, _, _, parts) in bufs.items():
                w, s, _ = mats[name]
                fp8_mma.fp8_mma(xq, sx, w[i], s[i], parts, stages=stages, pdl=True)

        arms = {"triton": graph_time(triton_chain, copies),
                f"mma pdl s{stages}": graph_time(mma_chain, copies)}
        for arm, us in arms.items():
            out.append({"matrix": "chain: " + " > ".join(SHAPES), "m": m, "arm": arm, "us": us,
                        "floor_us": floor, "copy_us": copy_us, "frac_floor": floor / us})
        print(f"chain m={m:2d} floor {floor:6.2f} copy {copy_us:6.2f} "
              + "  ".join(f"{a} {t:6.2f}" for a, t in arms.items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,4,16")
    ap.add_argument("--mma-groups", default="0", help="fp8_mma's consumer warpgroups")
    ap.add_argument("--hot", action="store_true",
                    help="also time the Triton and wgmma arms on one weight copy (in L2)")
    ap.add_argument("--mma-pdl-stages", default="",
                    help="fp8_mma launched programmatically dependent, these ring depths")
    ap.add_argument("--chain", type=int, default=0,
                    help="also time the matrices as one dependent chain, fp8_mma's ring this deep")
    ap.add_argument("--chain-only", action="store_true", help="only the chain")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    rows = []
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    if args.chain:
        rows += chain(list(map(int, args.ms.split(","))), args.chain, bw, dev)
    for name, (n, k) in SHAPES.items() if not args.chain_only else ():
        ws, ss, base = weight_copies(n, k, bw, dev)
        copies = len(ws)
        for m in map(int, args.ms.split(",")):
            xq = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            sx = torch.rand(m, k // 128, device=dev) + 0.5
            arms = {}
            bn, groups, split = fp8_linear.tiling(n, k)
            parts = torch.empty(split, m, n, device=dev)
            for pdl in (True, False):
                arms[f"triton{'' if pdl else ' nopdl'}"] = graph_time(
                    lambda i: fp8_linear.fp8_linear(xq, sx, ws[i], ss[i], parts, block_n=bn,
                                                    groups=groups, pdl=pdl), copies)
            split = fp8_mma.split_for(n, k)
            xq_mma = torch.zeros(max(m, fp8_mma.x_rows(m)), k, device=dev).to(torch.float8_e4m3fn)
            xq_mma[:m] = xq
            mma_parts = torch.empty(split, m, n, device=dev)
            for groups in map(int, args.mma_groups.split(",")):
                arms[f"mma c{groups} split{split}"] = graph_time(
                    lambda i: fp8_mma.fp8_mma(xq_mma, sx, ws[i], ss[i], mma_parts, groups=groups),
                    copies)
            for stages in map(int, args.mma_pdl_stages.split(",")) if args.mma_pdl_stages else ():
                arms[f"mma pdl s{stages} split{split}"] = graph_time(
                    lambda i: fp8_mma.fp8_mma(xq_mma, sx, ws[i], ss[i], mma_parts, stages=stages,
                                              pdl=True), copies)
            if args.hot:  # one weight copy, which stays in L2: each kernel's own latency
                arms["triton hot"] = graph_time(
                    lambda i: fp8_linear.fp8_linear(xq, sx, ws[0], ss[0], parts, block_n=bn,
                                                    groups=groups), copies)
                arms["mma hot"] = graph_time(
                    lambda i: fp8_mma.fp8_mma(xq_mma, sx, ws[0], ss[0], mma_parts), copies)
            for arm, us in arms.items():
                rows.append(dict(base, matrix=name, m=m, arm=arm, us=us,
                                 frac_floor=base["floor_us"] / us))
            print(f"{name:18s} m={m} floor {base['floor_us']:5.2f} copy {base['copy_us']:5.2f} "
                  + "  ".join(f"{a} {t:6.2f}" for a, t in arms.items()), flush=True)
        del ws, ss
    meta = run_meta(dev)
    meta.update(benchmark="sm90_gemv_probe", copy_bandwidth_bytes_per_s=bw)
    write_json("sm90_gemv_probe", {"meta": meta, "results": rows}, [args.out])


if __name__ == "__main__":
    main()
