"""Probe: does loading the weight tiles with TMA (Triton tensor descriptors) bring a small-M
FP8 block-128 GEMV closer to HBM bandwidth than ``fp8_linear``'s pointer loads?

``fp8_linear`` stages its weight tiles through Triton's cp.async pipeline: every thread issues
16-byte copies and computes their addresses. A tensor descriptor has one thread issue a bulk
copy of the whole [BLOCK_N, 128] tile, completed on an mbarrier, so a program can keep more
stages in flight for the same instructions. This probe times, in CUDA graphs over enough weight
copies that nothing stays in L2 (``gemv_probe.graph_time``), the stage kernel at its layer
tiling against a descriptor-load twin over tilings and pipeline depths, and a device copy of
the same bytes; every variant's partials are compared with the stage kernel's first.

Measured on an H200 (results/tma_probe_h200_a787b2c.json): no tiling is clearly faster. At
1 and 16 rows the best descriptor variant is 6.5 / 6.9 us on q_a|kv_a (stage kernel 8.1 /
8.6, copy 4.3), 5.7 / 6.1 on o_proj (6.0 / 6.4), 10.4 / 10.9 on 9 experts' gate/up (12.4 /
13.6, copy 7.4), but neighbouring variants scatter by 2-5 us and the stage kernel's own time
moved by 1.2 us against an earlier probe: within this probe's noise, not a new floor. So
fp8_linear keeps its pointer loads.

``--hot-only`` times the stage kernel alone, on the rotated copies (cold) and on one copy that
stays in L2 (hot). On an H200 (results/tma_probe_hot_h200_4cd6276.json), at one row, cold then
hot: q_a|kv_a 8.3 / 5.4 us, o_proj 6.1 / 3.9, 9 experts' gate/up 12.6 / 7.9. Even from L2 a
launch costs microseconds of its own latency, which led to ``fp8_linear.SCALES_AHEAD``.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.tma_probe --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from benchmark.gemv_probe import copy_bandwidth, graph_time, weight_copies
from sgl_kernel_ext.triton import fp8_linear, overlap
from sgl_kernel_ext.triton.fp8_linear import _fp8_linear_prefetch, group_x
from sgl_kernel_ext.triton.overlap import stage_begin

SHAPES = {"q_a|kv_a": (2624, 6144), "o_proj": (6144, 2048), "9_experts_gate_up": (4608, 6144)}


@triton.jit
def _tma_linear_kernel(xq_ptr, sx_ptr, M, K, k_chunk, w_desc, w_ptr, s_ptr, part_ptr, N,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                       PDL: tl.constexpr):
    """``fp8_linear``'s transposed-MMA program (tile, K chunk) with each 128-column group of
    the weight tile loaded through the tensor descriptor w_desc ([N, K], block [BLOCK_N, 128])."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    _fp8_linear_prefetch(tile, split, K, k_chunk, w_ptr, N, tl.num_programs(0), w_ptr, N,
                         BLOCK_N, PDL)
    stage_begin(PDL)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    kblocks = tl.cdiv(K, 128)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    kb0 = split * k_chunk
    kb_end = tl.minimum(kb0 + k_chunk, kblocks)
    for kb in range(kb0, kb_end, GROUPS):
        for g in tl.static_range(GROUPS):
            kbg = tl.minimum(kb + g, kb_end - 1)
            w = w_desc.load([tile * BLOCK_N, kbg * 128])
            sw = tl.load(s_ptr + (offs_n // 128) * kblocks + kbg, mask=n_ok, other=0.0)
            x, sx = group_x(xq_ptr, sx_ptr, M, K, kbg, BLOCK_M)
            part = tl.dot(w, tl.trans(x), max_num_imprecise_acc=fp8_linear.SWAP_IMPRECISE_ACC)
            acc += part * sw[:, None] * sx[None, :] * (kb + g < kb_end)
    acc = tl.trans(acc)
    offs_m = tl.arange(0, BLOCK_M)
    out = part_ptr + (split * M + offs_m[:, None]) * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & n_ok[None, :])


def tma_linear(xq, sx, wq, ws, parts, desc, block_n, groups, stages, pdl=True):
    m, k = xq.shape
    split = parts.shape[0]
    tiles, _, k_chunk = fp8_linear.grid_shape(wq.shape[0], 0, k, split, block_n, groups)
    use_pdl = pdl and overlap.enabled()
    _tma_linear_kernel[(tiles, split)](
        xq, sx, m, k, k_chunk, desc, wq, ws, parts, wq.shape[0],
        BLOCK_M=fp8_linear.block_m(m), BLOCK_N=block_n, GROUPS=groups, PDL=use_pdl,
        num_warps=fp8_linear.NUM_WARPS, num_stages=stages,
        **(overlap.launch_kw() if use_pdl else {}))


def variants():
    for bn in (64, 128):
        for g in (1, 2):
            for stages in (3, 4, 6):
                for target in (264, 528):
                    yield bn, g, stages, target


def main() -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--hot-only", action="store_true", help="only the stage kernel, cold and hot")
    args = ap.parse_args()
    dev = "cuda"
    bw = copy_bandwidth(dev)
    results = {"copy_bandwidth_bytes_per_s": bw, "pdl": overlap.enabled(),
               "commit": os.environ.get("BENCH_COMMIT"), "rows": []}
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, pdl={overlap.enabled()}", flush=True)
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        ws, ss, row = weight_copies(n, k, bw, dev)
        row = dict(row, matrix=name)
        copies = len(ws)
        for m in map(int, args.ms.split(",")):
            xq = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            sx = torch.rand(m, k // 128, device=dev) + 0.5
            bn, g, split = fp8_linear.tiling(n, k)
            ref = torch.empty(split, m, n, device=dev)
            t = graph_time(lambda i: fp8_linear.fp8_linear(xq, sx, ws[i], ss[i], ref,
                                                           block_n=bn, groups=g), copies)
            fp8_linear.fp8_linear(xq, sx, ws[0], ss[0], ref, block_n=bn, groups=g)
            ref_sum = ref.sum(0)
            base = dict(row, m=m, variant=f"stage {bn}x{g} split {split}", us=t)
            results["rows"].append(base)
            print(f"{name:18s} m={m:2d} {base['variant']:28s} {t:7.2f} us  copy "
                  f"{row['copy_us']:5.2f}", flush=True)
            # the same launches on one weight copy, which then stays in L2 (as a prefetched
            # stage's would): what the kernel costs when HBM is not its limit
            t = graph_time(lambda i: fp8_linear.fp8_linear(xq, sx, ws[0], ss[0], ref,
                                                           block_n=bn, groups=g), copies)
            hot = dict(row, m=m, variant=f"stage {bn}x{g} split {split} L2-hot", us=t)
            results["rows"].append(hot)
            print(f"{name:18s} m={m:2d} {hot['variant']:28s} {t:7.2f} us", flush=True)
            if args.hot_only:
                continue
            for bn, g, stages, target in variants():
                split = fp8_linear.choose_split(n, k, bn, g, target, True)
                parts = torch.full((split, m, n), float("nan"), device=dev)
                descs = [TensorDescriptor.from_tensor(w, [bn, 128]) for w in ws]
                name_v = f"tma {bn}x{g} s{stages} t{target}"
                try:
                    tma_linear(xq, sx, ws[0], ss[0], parts, descs[0], bn, g, stages)
                    torch.cuda.synchronize()
                    err = ((parts.sum(0) - ref_sum).abs().max() / ref_sum.abs().max()).item()
                    t = graph_time(lambda i: tma_linear(xq, sx, ws[i], ss[i], parts, descs[i],
                                                        bn, g, stages), copies)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{name} m={m} {name_v}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                r = dict(row, m=m, variant=name_v, split=split, us=t, rel_err=err)
                results["rows"].append(r)
                print(f"{name:18s} m={m:2d} {name_v:28s} {t:7.2f} us  split {split:2d} "
                      f"err {err:.1e}", flush=True)
        del ws, ss
    with open(os.path.join(args.out, "tma_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
