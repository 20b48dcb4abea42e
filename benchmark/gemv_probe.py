"""Probe: how close one small-M FP8 block-128 GEMV gets to HBM bandwidth, per kernel shape.

Times, in CUDA graphs over enough distinct weight copies that nothing stays in L2, the stage
kernel ``fp8_linear`` over tilings (rows per program, 128-column groups per step, programs
in all; with and without the overlap) and a device copy of the same bytes (the practical
ceiling for a kernel of that size). A single-shot variant (each program loading its whole
[groups x rows x 128] tile at once into one batched dot) was slower at every shape
(results/gemv_probe_h200_361c489.json) and was dropped.

    PYTHONPATH=python:sgl-kernel-ext python3 -m benchmark.gemv_probe --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton

from sgl_kernel_ext.triton import fp8_linear, overlap

SHAPES = {"q_a|kv_a": (2624, 6144), "o_proj": (6144, 2048), "q_b|wq_b": (6144, 2048),
          "expert_gate_up": (512, 6144), "9_experts_gate_up": (4608, 6144),
          "9_experts_down": (55296, 256)}


def graph_time(fn, copies: int, replays: int = 20) -> float:
    """us per call: fn(i) for i in range(copies) captured in one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / copies)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(dev) -> float:
    """Bytes a second of a device copy of 1 GiB (read plus write)."""
    src = torch.empty(2**30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = graph_time(lambda i: dst.copy_(src), 4)
    return 2 * src.numel() / (us * 1e-6)


def weight_copies(n: int, k: int, bw: float, dev) -> tuple:
    """(e4m3 [n, k] weights, their block scales, the matrix's row: its bytes, floor and the
    time to read them as half a device copy) with enough copies that cycling through them
    leaves none in L2."""
    nbytes = n * k
    copies = max(8, -(-240 * 2**20 // nbytes))
    ws = [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn) for _ in range(copies)]
    ss = [torch.rand(-(-n // 128), k // 128, device=dev) + 0.5 for _ in range(copies)]
    src = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(copies)]
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    row = {"n": n, "k": k, "bytes": nbytes, "floor_us": nbytes / bw * 1e6}
    row["copy_us"] = graph_time(lambda i: dst.copy_(src[i]), copies) * 0.5  # read half
    return ws, ss, row


def probe_variants(n: int, k: int, m: int) -> list:
    """The fp8_linear configurations timed for an [n, k] matrix at m rows."""
    out = []
    for bn, g, target in ((64, 2, 264), (64, 2, 528), (32, 2, 528), (64, 1, 528), (128, 2, 264),
                          (64, 4, 264), (32, 4, 528), (32, 1, 1056)):
        for pdl in (True, False):
            out.append({"name": f"loop {bn}x{g} t{target}" + ("" if pdl else " nopdl"),
                        "split": fp8_linear.choose_split(n, k, bn, g, target),
                        "kw": {"block_n": bn, "groups": g, "pdl": pdl}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,4,16")
    args = ap.parse_args()
    dev = "cuda"
    bw = copy_bandwidth(dev)
    results = {"copy_bandwidth_bytes_per_s": bw, "pdl": overlap.enabled(), "rows": []}
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, pdl={overlap.enabled()}")
    for name, (n, k) in SHAPES.items():
        ws, ss, row = weight_copies(n, k, bw, dev)
        row = dict(row, matrix=name)
        floor_us, copies = row["floor_us"], len(ws)
        for m in map(int, args.ms.split(",")):
            xq = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            sx = torch.rand(m, k // 128, device=dev) + 0.5
            for variant in probe_variants(n, k, m):
                parts = torch.empty(variant["split"], m, n, device=dev)
                try:
                    t = graph_time(lambda i: fp8_linear.fp8_linear(
                        xq, sx, ws[i], ss[i], parts, **variant["kw"]), copies)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{name} m={m} {variant['name']}: {type(exc).__name__}: {exc}")
                    continue
                r = dict(row, m=m, variant=variant["name"], us=t, frac_floor=floor_us / t)
                results["rows"].append(r)
                print(f"{name:16s} m={m:2d} {variant['name']:28s} {t:7.2f} us  floor "
                      f"{floor_us:5.2f}  copy {row['copy_us']:5.2f}  {floor_us / t:5.2f}")
        del ws, ss
    with open(os.path.join(args.out, "gemv_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
