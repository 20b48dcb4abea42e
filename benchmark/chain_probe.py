"""What one link of a chain of dependent kernels costs on this GPU, by how the link waits.

A decode layer on the stage kernels is a chain of ~13 dependent launches at 1 row, each
too small to hide its own start and finish. This probe times a chain of trivial stages
(each program reads a block another program of the previous stage wrote, adds one, writes)
in a CUDA graph, for the ways a stage can wait for the previous one:

- ``plain``: ordinary launches (the stream orders them);
- ``pdl``: programmatic dependent launch, ``griddepcontrol.wait`` first (the stage kernels'
  ``overlap.stage_begin``);
- ``flags``: programmatic dependent launch, the dependents released at once, then a spin on
  a counter in global memory that every program of the previous stage bumps (release) after
  its stores: the previous grid's completion is not waited for, only its programs' stores;
- ``persistent``: one launch of G resident programs, a grid-wide counter barrier per stage.

Per link: (graph us of 2S stages - graph us of S stages) / S. The final values are checked
(every element must equal the number of stages), so a wait that lets a stage read stale data
fails the run instead of timing it.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.chain_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

from benchmark.harness import git_commit
from sgl_kernel_ext.triton.overlap import gdc_launch_dependents, gdc_wait

MODES = ("plain", "pdl", "flags", "persistent")


@triton.jit
def _spin_until(counter_ptr, target):
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _link(src_ptr, dst_ptr, pid, G, BLOCK: tl.constexpr):
    # read the block of the program "opposite" this one in the previous stage
    offs = ((pid + G // 2 + 1) % G) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs)
    tl.store(dst_ptr + pid * BLOCK + tl.arange(0, BLOCK), x + 1.0)


@triton.jit
def _stage_kernel(src_ptr, dst_ptr, flag_in_ptr, flag_out_ptr, target, MODE: tl.constexpr,
                  BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    if MODE == 1:
        gdc_wait()
        gdc_launch_dependents()
    if MODE == 2:
        gdc_launch_dependents()
        _spin_until(flag_in_ptr, target)
    _link(src_ptr, dst_ptr, pid, G, BLOCK)
    if MODE == 2:
        tl.debug_barrier()
        tl.atomic_add(flag_out_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _persistent_kernel(buf_ptr, n, barrier_ptr, S, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    for s in range(S):
        _link(buf_ptr + (s % 2) * n, buf_ptr + ((s + 1) % 2) * n, pid, G, BLOCK)
        tl.debug_barrier()
        tl.atomic_add(barrier_ptr, 1, sem="release", scope="gpu")
        _spin_until(barrier_ptr, (s + 1) * G)


def chain(mode: str, stages: int, programs: int, block: int, bufs, flags):
    """A callable launching the chain (bufs: [2, programs * block] fp32; flags: int32)."""
    n = programs * block
    pdl = {"launch_pdl": True} if mode in ("pdl", "flags") else {}
    code = MODES.index(mode)

    def run():
        flags.zero_()
        bufs[0].zero_()
        if mode == "persistent":
            _persistent_kernel[(programs,)](bufs, n, flags, stages, BLOCK=block, num_warps=4)
            return
        for s in range(stages):
            target = 0 if s == 0 else programs
            _stage_kernel[(programs,)](bufs[s % 2], bufs[(s + 1) % 2], flags[s], flags[s + 1],
                                       target, MODE=code, BLOCK=block, num_warps=4, **pdl)
    return run


def graph_us(fn, replays: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def run(out_dir: str, stages: int, programs_list, block: int):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for programs in programs_list:
        if programs > sms:
            continue
        bufs = torch.empty(2, programs * block, device="cuda")
        flags = torch.zeros(2 * stages + 1, dtype=torch.int32, device="cuda")
        for mode in MODES:
            us = {}
            for s in (stages, 2 * stages):
                fn = chain(mode, s, programs, block, bufs, flags)
                us[s] = graph_us(fn)
                got = bufs[s % 2]
                if not torch.all(got == float(s)):
                    raise AssertionError(f"{mode} G={programs} S={s}: stale reads "
                                         f"({int((got != s).sum())} wrong elements)")
            link = (us[2 * stages] - us[stages]) / stages
            r = {"mode": mode, "programs": programs, "stages": stages, "block": block,
                 "graph_us": us[stages], "graph_us_2s": us[2 * stages], "link_us": link}
            results.append(r)
            print(f"{mode:10s} G={programs:4d}: {us[stages]:7.2f} us for {stages} stages, "
                  f"{link:5.2f} us a link", flush=True)
    meta = {"benchmark": "chain_probe", "commit": os.environ.get("BENCH_COMMIT") or git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__, "sms": sms}
    path = os.path.join(out_dir, f"chain_probe_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print("wrote", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".")
    p.add_argument("--stages", type=int, default=13)
    p.add_argument("--programs", default="8,32,132")
    p.add_argument("--block", type=int, default=1024)
    a = p.parse_args()
    run(a.out, a.stages, [int(x) for x in a.programs.split(",")], a.block)


if __name__ == "__main__":
    main()
