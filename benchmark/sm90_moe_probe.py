"""Probe: a MoE's experts on the CuTe DSL kernels (``nvidia.sm90.fp8_moe``: gate/up with
SwiGLU and the down input's quant, then down, as two launches; and ``experts``, both in one
launch: arm "sm90 fused") against the Triton kernels (``triton.moe.gate_up`` and ``down`` in
the layer's tiling), each followed by the same Triton sum of the terms, at 1-16 rows, in the
same run.

Each arm launches as the fused layer does: inside ``overlap.step_rows(m)``, Triton's expert
kernels also inside ``overlap.wide()`` (so with programmatic dependent launch only up to
overlap.WIDE_MAX_ROWS rows), fp8_moe's with it up to overlap.MAX_ROWS (``--pdl 0``: never,
1: always). Results before 6155ffb ran the Triton arm with it at every row count, which the
layer does not do from 3 rows (overlap.WIDE_MAX_ROWS says what it costs there): they may
understate Triton from 3 rows. In the layer, fp8_moe was slower than Triton from 4 rows
(tiling_probe_20261202T125957Z) while those runs had it even or faster; not re-measured yet.

One TP8 rank of GLM-5.3: 256 routed experts of [256, 6144] gate/up and [6144, 256] down, and a
shared one. Each arm is a CUDA graph of `copies` steps, each with its own random routing
(top-8 distinct experts a row), so the experts a step touches are mostly not in L2 (the stack
is 1.2 GB). The floor is the bytes of the experts a step touches (gate, up and down of each)
over the measured copy bandwidth.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.sm90_moe_probe --out $OUT
"""

from __future__ import annotations

import argparse

import torch

from benchmark.gemv_probe import copy_bandwidth, graph_time
from benchmark.harness import run_meta, write_json
from sgl_kernel_ext.nvidia.sm90 import fp8_moe
from sgl_kernel_ext.nvidia.sm90.fp8_mma import x_rows
from sgl_kernel_ext.triton import moe as tmoe
from sgl_kernel_ext.triton import overlap

E, INTER, HIDDEN, TOPK = 256, 256, 6144, 8


def routing(m: int, gen, dev) -> dict:
    """A random step's slot table (slot 0 the shared expert, then the chosen experts
    ascending), as triton.moe.route writes it."""
    slots = m * TOPK + 1
    choice = torch.stack([torch.randperm(E, generator=gen)[:TOPK] for _ in range(m)])
    used = torch.unique(choice)
    n = 1 + used.numel()
    se = torch.zeros(slots, dtype=torch.int32)
    se[0], se[1:n] = E, used.int()
    sw = torch.zeros(slots, m)
    sr = torch.full((slots, m), -1, dtype=torch.int32)
    sw[0], sr[0] = 1.0, 0
    for row in range(m):
        for j, ex in enumerate(choice[row].sort().values.tolist()):
            s = 1 + int((used == ex).nonzero())
            sw[s, row], sr[s, row] = 0.1 + torch.rand(1, generator=gen).item(), j + 1
    return {"slot_expert": se.to(dev), "slot_weight": sw.to(dev), "slot_rank": sr.to(dev),
            "num_slots": torch.tensor([n], dtype=torch.int32, device=dev), "touched": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--stages", default="0", help="fp8_moe ring depths, both forms (0: its "
                    "default; a multiple of its 2 consumer warpgroups)")
    ap.add_argument("--pdl", type=int, default=-1,
                    help="fp8_moe's programmatic dependent launch: -1 as the layer "
                    "(overlap.enabled() in the step), 0 never, 1 always")
    ap.add_argument("--stacks", type=int, default=1,
                    help="expert stacks, step i using stack i %% stacks (a layer benchmark's "
                    "footprint: one a layer)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    e4m3 = torch.float8_e4m3fn
    stacks = []
    for _ in range(args.stacks):
        w13 = torch.empty(E, 2 * INTER, HIDDEN, dtype=e4m3, device=dev)
        for e in range(0, E, 32):  # in pieces: randn's fp32 of the whole stack is 3 GB
            w13[e:e + 32] = torch.randn(32, 2 * INTER, HIDDEN, device=dev).to(e4m3)
        w13_s = torch.rand(E, 2 * INTER // 128, HIDDEN // 128, device=dev) * 0.02 + 0.002
        down = torch.randn(E, HIDDEN, INTER, device=dev).to(e4m3)
        down_s = torch.rand(E, HIDDEN // 128, INTER // 128, device=dev) * 0.02 + 0.002
        stacks.append((w13[:, :INTER], w13_s[:, :INTER // 128], w13[:, INTER:],
                       w13_s[:, INTER // 128:], down, down_s))
    sh = [torch.randn(INTER, HIDDEN, device=dev).to(e4m3) for _ in range(2)]
    sh_s = [torch.rand(INTER // 128, HIDDEN // 128, device=dev) * 0.02 + 0.002 for _ in range(2)]
    sh_down = torch.randn(HIDDEN, INTER, device=dev).to(e4m3)
    sh_down_s = torch.rand(HIDDEN // 128, INTER // 128, device=dev) * 0.02 + 0.002
    expert_bytes = 3 * INTER * HIDDEN
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    gen = torch.Generator().manual_seed(0)
    rows = []
    for m in [int(v) for v in args.ms.split(",")]:
        steps = [routing(m, gen, dev) for _ in range(args.copies)]
        slots = m * TOPK + 1
        nx = x_rows(m)
        xq = torch.randn(nx, HIDDEN, device=dev).to(e4m3)
        sx = torch.rand(m, HIDDEN // 128, device=dev) + 0.5
        pos = torch.arange(m, device=dev)
        terms = torch.empty(m, TOPK + 1, HIDDEN, dtype=torch.bfloat16, device=dev)
        out = torch.empty(m, HIDDEN, dtype=torch.bfloat16, device=dev)
        # Triton's buffers, in the layer's tiling
        act = torch.empty(slots, m, INTER, dtype=torch.bfloat16, device=dev)
        tiling = tmoe.gate_up_tiling(m, False)
        gu_parts = (torch.empty(tiling[2], slots, m, 2, INTER, device=dev)
                    if tiling[2] > 1 else None)
        gu_arr = torch.zeros(slots * INTER, dtype=torch.int32, device=dev)
        block_n, warps = tmoe.down_shape(m, False)
        # fp8_moe's
        parts = torch.empty(fp8_moe.gate_up_parts_rows(slots, INTER, HIDDEN,
                                                       sms * fp8_moe.GROUPS), m, 2 * INTER,
                            device=dev)
        arr = torch.zeros(slots * (INTER // 128), dtype=torch.int32, device=dev)
        act_q = torch.empty(slots * nx, INTER, dtype=e4m3, device=dev)
        act_s = torch.empty(slots * m, INTER // 128, device=dev)
        flags = torch.zeros(fp8_moe.flags_size(slots, INTER), dtype=torch.int32, device=dev)

        with overlap.step_rows(m):
            mma_pdl = overlap.enabled() if args.pdl < 0 else bool(args.pdl)

        def triton_arm(i):
            with overlap.step_rows(m), overlap.wide():
                triton_step(i)

        def triton_step(i):
            s = steps[i]
            gate, gate_s, up, up_s, down, down_s = stacks[i % len(stacks)]
            tmoe.gate_up(xq[:m], sx, E, s["slot_expert"], s["num_slots"], gate, gate_s, up,
                         up_s, sh[0], sh_s[0], sh[1], sh_s[1], act, gu_parts, tiling=tiling,
                         arrivals=gu_arr)
            tmoe.down(act, E, s["slot_expert"], s["slot_weight"], s["slot_rank"],
                      s["num_slots"], down, down_s, sh_down, sh_down_s, pos, terms, out,
                      block_n=block_n, num_warps=warps)

        def mma_arm(stages):
            def run(i):
                with overlap.step_rows(m):
                    step(i)

            def step(i):
                s = steps[i]
                gate, gate_s, up, up_s, down, down_s = stacks[i % len(stacks)]
                fp8_moe.gate_up(xq, sx, gate, gate_s, up, up_s, sh[0], sh_s[0], sh[1],
                                sh_s[1], s["slot_expert"], s["num_slots"], parts, arr, act_q,
                                act_s, stages=stages, pdl=mma_pdl)
                fp8_moe.down(act_q, act_s, down, down_s, sh_down, sh_down_s, s["slot_expert"],
                             s["num_slots"], s["slot_weight"], s["slot_rank"], terms,
                             stages=stages, pdl=mma_pdl)
                tmoe.sum_terms(terms, pos, out)
            return run

        def fused_arm(stages):
            def run(i):
                with overlap.step_rows(m):
                    fused_step(i, stages)
            return run

        def fused_step(i, stages):
            s = steps[i]
            gate, gate_s, up, up_s, down, down_s = stacks[i % len(stacks)]
            fp8_moe.experts(xq, sx, gate, gate_s, up, up_s, down, down_s, sh[0], sh_s[0], sh[1],
                            sh_s[1], sh_down, sh_down_s, s["slot_expert"], s["num_slots"],
                            s["slot_weight"], s["slot_rank"], parts, arr, flags, act_q, act_s,
                            terms, stages=stages, pdl=mma_pdl)
            tmoe.sum_terms(terms, pos, out)

        touched = sum(s["touched"] for s in steps) / len(steps)
        floor = touched * expert_bytes / bw * 1e6
        arms = {"triton": graph_time(triton_arm, args.copies)}
        for st in [int(v) for v in args.stages.split(",")]:
            arms[f"sm90 s{st}"] = graph_time(mma_arm(st), args.copies)
        for st in [int(v) for v in args.stages.split(",")]:
            arms["sm90 fused" + (f" s{st}" if st else "")] = graph_time(fused_arm(st),
                                                                       args.copies)
        fp8_moe.check_flags(flags)
        for arm, us in arms.items():
            rows.append({"m": m, "arm": arm, "us": us, "experts_touched": touched,
                         "floor_us": floor, "frac_floor": floor / us})
        print(f"m={m:2d} experts {touched:5.1f} floor {floor:6.2f} us  "
              + "  ".join(f"{a} {t:6.2f} ({floor / t:.0%})" for a, t in arms.items()),
              flush=True)
    meta = run_meta(dev)
    meta.update(benchmark="sm90_moe_probe", args=dict(vars(args), out="$OUT"),
                copy_bandwidth_Bps=bw)
    write_json("sm90_moe_probe", {"meta": meta, "results": rows}, [args.out])


if __name__ == "__main__":
    main()
