"""What one persistent launch that streams a decode layer's weights ahead of its dependencies
would take at one row (CuTe DSL, sm_90): the measurement DESIGN's kernel plan step 2 rests on.

The stage kernels leave HBM idle for most of a layer at one row (57 us against a 19.8 us
floor): each of a dozen dependent launches starts its loads only after its wait. Step 2 is
one resident CTA per SM whose producer warps stream every stage's weight tiles through shared
memory without waiting for activations, and whose consumers wait only where the math needs
the previous stage. Before any stage is written for it, this probe times that structure on a
layer's bytes:

- A layer is a list of stages, each a number of 64 x 128 e4m3 weight tiles (8 KB each, laid
  out one after another) cut into units of a few tiles. Units are numbered stage by stage;
  worker w (a CTA's consumer warpgroup, with its own producer warp and its own part of the
  ring) takes units w, w + W, w + 2W, ... (W workers). Deadlock-free with every CTA
  resident: the lowest unfinished unit's worker has finished its earlier units, and its
  producer streams only its own.
- Producer warp: for each of its worker's units, each tile into the next ring slot (TMA), with
  an 8-row x tile beside it. It waits for nothing but ring space, except in a *late* stage,
  whose bytes are chosen by the stage before (the routed experts by the router, the KV rows by
  the top-k): there it first waits for the previous stage's counter, as a real producer must.
- Consumer warpgroup: before a unit of a stage it has not yet entered, wait until the
  previous stage's counter holds all its units (one thread polls, acquire), then read a
  value the previous stage "produced" (an L2 round trip after the wait, as an activation
  read is); then the unit's wgmma (64 x 8 x 128 a tile, fp32) and its store, and one arrival
  on its stage's counter (release).

What it leaves out (so it is a lower bound for the stages' own work): the split-K sums and
quantization between stages, the norms', routing's and the attention's arithmetic. What it
keeps: every byte streamed through shared memory once, each dependency as a grid-wide count,
the late stages' loads after their dependency. Arms, in one run: ``chain`` (the dependencies),
``stream`` (none: the machinery's streaming rate), and the copy floor. A stack of LAYERS
layers (distinct bytes, several times the L2) is one launch; time per layer = launch / LAYERS.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.stream_chain_probe --out $OUT

Measured on an H200 (results/stream_chain_probe_20261204T035233Z, T035521Z; 4 layers, 19.6-
19.7 us floor a layer): streaming alone 26.8-28.0 us a layer (70-73% of the floor); the layer's
13 stages with their dependencies 46.1-47.5 (42%); every stage's bytes known ahead 42.7-44.1;
the byte-less stages folded away (9 stages) 40.6-41.3; both 36.3-37.7 (52-54%); the 13
dependencies alone (a tile a stage) 17.5-18.5 us, 1.35-1.4 us a dependency. The dependencies
add to the streaming instead of hiding under it: at each stage's end the workers that finish
first wait for the last, and its streaming, not the ring, sets when the next stage starts.
Neither one worker a CTA (twice the ring a worker) nor one fence an arrival changed that.
"""

from __future__ import annotations

import argparse
import functools

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from sgl_kernel_ext.nvidia.sm90 import ring

BLOCK_M, BLOCK_K = ring.BLOCK_M, ring.BLOCK_K
TILE_BYTES = BLOCK_M * BLOCK_K
NX = 8  # x rows a tile: wgmma's N (1-8 rows)
GROUPS = 2  # consumer warpgroups (and producer warps) a CTA, by default
OUT_ROWS = 4096  # units' outputs kept (a unit stores over u % OUT_ROWS)
SMEM_BYTES = 200 * 1024
# one TP8 rank's MoE layer (no indexer) at one row, in 8 KB tiles: (name, MB, late). The
# norms and the sum stream nothing but are dependencies (one tile each). The attention's KV
# rows (2048 x 576 bf16) and the 9 experts' weights are chosen by the stage before.
LAYER = (("norm1", 0.0, False), ("q_a|kv_a", 16.12, False), ("latent", 0.0, False),
         ("q_b", 4.19, False), ("absorb", 1.05, False), ("attention", 2.36, True),
         ("absorb_v", 1.05, False), ("o_proj", 12.58, False), ("norm2", 0.0, False),
         ("router", 3.15, False), ("gate_up", 28.31, True), ("down", 14.16, True),
         ("sum", 0.0, False))


# the layer as it is; with every stage's bytes known ahead (no late stage: what speculating
# on the experts and the top-k would buy); without the byte-less stages (the norms and the
# sum folded into their neighbours); both; and the dependencies alone (each stage one tile)
CONFIGS = {
    "layer": LAYER,
    "no_late": tuple((n, mb, False) for n, mb, _ in LAYER),
    "no_small": tuple(s for s in LAYER if s[1] > 0),
    "no_small_no_late": tuple((n, mb, False) for n, mb, _ in LAYER if mb > 0),
    "hops_only": tuple((n, 0.0, False) for n, _, _ in LAYER),
}
# (config, dependencies, workers a CTA, activation read after each wait, fewest tiles a unit):
# the configs as measured on 2026-12-04 (below), then two not yet run on a GPU: a dependency
# without its activation read (what the signal alone costs) and the layer in units of at
# least 16 tiles (fewer arrivals: whether they hold the streaming at 70-73%)
ARMS = [("layer", True, GROUPS, True, 1), ("layer", False, GROUPS, True, 1),
        ("layer", True, 1, True, 1), ("no_late", True, GROUPS, True, 1),
        ("no_small", True, GROUPS, True, 1), ("no_small_no_late", True, GROUPS, True, 1),
        ("no_small_no_late", True, 1, True, 1), ("hops_only", True, GROUPS, True, 1),
        ("hops_only", True, 1, True, 1), ("hops_only", True, GROUPS, False, 1),
        ("layer", False, GROUPS, True, 16), ("layer", True, GROUPS, True, 16)]


def stage_tiles(mb: float) -> int:
    return max(1, round(mb * 1e6 / TILE_BYTES))


class StreamChain:
    """One compiled chain: per stage (tiles, late), LAYERS times; `deps` False drops every
    wait (the streaming alone); `act` False drops the read after each wait; units of at least
    `min_chunk` tiles where a stage has them."""

    def __init__(self, stages: tuple, layers: int, sms: int, deps: bool, groups: int = GROUPS,
                 act: bool = True, min_chunk: int = 1):
        self.deps = deps
        self.act = act
        self.groups = groups
        workers = sms * groups
        self.tiles, self.late, self.chunk, self.units = [], [], [], []
        for _ in range(layers):
            for tiles, late in stages:
                units = min(workers, max(1, tiles // min_chunk))
                chunk = -(-tiles // units)
                self.tiles.append(tiles)
                self.late.append(late)
                self.chunk.append(chunk)
                self.units.append(-(-tiles // chunk))
        self.n_stages = len(self.tiles)
        self.unit_start = [sum(self.units[:s]) for s in range(self.n_stages)]
        self.tile_start = [sum(self.tiles[:s]) for s in range(self.n_stages)]
        self.total_units = sum(self.units)
        self.total_tiles = sum(self.tiles)
        self.slot_bytes = (BLOCK_M + NX) * BLOCK_K
        self.per = (SMEM_BYTES - 2048) // self.slot_bytes // groups
        self.stages = self.per * groups
        self.threads = 128 * (1 + groups)

    @cute.jit
    def __call__(self, w: cute.Tensor, x: cute.Tensor, out: cute.Tensor, act: cute.Tensor,
                 counters: cute.Tensor, grid: cutlass.Int32, stream):
        tiled_mma, a_layout, b_layout = ring.mma_and_layouts(NX, self.stages, self.stages)
        tma_a, tma_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w, cute.slice_(a_layout, (None, None, 0)),
            (BLOCK_M, BLOCK_K))
        tma_b, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), x, cute.slice_(b_layout, (None, None, 0)),
            (NX, BLOCK_K))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sa: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN,
                                                       cute.cosize(a_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN,
                                                       cute.cosize(b_layout)], 1024]

        self.storage = Storage
        self.kernel(tma_a, tma_w, tma_b, tma_x, tiled_mma, a_layout, b_layout, out, act,
                    counters).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1],
                                     smem=Storage.size_in_bytes(), stream=stream)

    @cute.jit
    def _unit(self, u):
        """(stage, first tile, tiles) of unit u."""
        stage = cutlass.Int32(0)
        first = cutlass.Int32(0)
        count = cutlass.Int32(0)
        for s in cutlass.range_constexpr(self.n_stages):
            if u >= self.unit_start[s]:
                stage = cutlass.Int32(s)
                first = self.tile_start[s] + (u - self.unit_start[s]) * self.chunk[s]
                count = cutlass.min(self.chunk[s], self.tile_start[s] + self.tiles[s] - first)
        return stage, first, count

    @cute.jit
    def _needed(self, stage):
        """Units the stage before `stage` must count before `stage` may use its output."""
        need = cutlass.Int32(0)
        for s in cutlass.range_constexpr(1, self.n_stages):
            if stage == s:
                need = cutlass.Int32(self.units[s - 1])
        return need

    @cute.jit
    def _is_late(self, stage):
        late = cutlass.Boolean(False)
        for s in cutlass.range_constexpr(self.n_stages):
            if cutlass.const_expr(self.late[s]):
                if stage == s:
                    late = cutlass.Boolean(True)
        return late

    @cute.jit
    def _wait_count(self, counters: cute.Tensor, stage):
        """Poll (acquire loads: polled by atomics, which serialize on the counter's line with
        the arrivals, the layer took 427 us instead of 47, results/stream_chain_probe_
        20261204T034853Z against T034948Z) until the stage before `stage` has counted all
        its units."""
        if stage > 0:
            need = self._needed(stage)
            ptr = counters.iterator + (stage - 1)
            seen = cute.arch.load(ptr, cutlass.Int32, sem="acquire", scope="gpu")
            while seen < need:
                seen = cute.arch.load(ptr, cutlass.Int32, sem="acquire", scope="gpu")

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mW: cute.Tensor, tma_b: cute.CopyAtom,
               mX: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               b_layout: cute.ComposedLayout, mOut: cute.Tensor, mAct: cute.Tensor,
               mCounters: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        s_a = storage.sa.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        s_b = storage.sb.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        pipe = ring.make_pipe(storage.bars.data_ptr(), self.stages, self.slot_bytes)
        g_a = cute.local_tile(mW, (BLOCK_M, BLOCK_K), (None, None))
        g_b = cute.local_tile(mX, (NX, BLOCK_K), (None, None))
        t_sa, t_ga = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                           cute.group_modes(s_a, 0, 2), cute.group_modes(g_a, 0, 2))
        t_sb, t_gb = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                           cute.group_modes(s_b, 0, 2), cute.group_modes(g_b, 0, 2))
        workers = grid * self.groups
        if wg == 0:
            if warp < self.groups:  # producer warp `warp` streams for consumer warpgroup `warp`
                me = warp * grid + bidx
                own = cutlass.Int32(0)
                for u in cutlass.range(me, self.total_units, workers, unroll=1):
                    stage, first, count = self._unit(u)
                    if cutlass.const_expr(self.deps):
                        if self._is_late(stage):
                            self._wait_count(mCounters, stage)
                    for j in cutlass.range(count, unroll=1):
                        put = ring.ring_state(self.stages, self.per, warp, own, True)
                        pipe.producer_acquire(put)
                        bar = pipe.producer_get_barrier(put)
                        cute.copy(tma_a, t_ga[(None, first + j, 0)], t_sa[(None, put.index)],
                                  tma_bar_ptr=bar)
                        cute.copy(tma_b, t_gb[(None, 0, 0)], t_sb[(None, put.index)],
                                  tma_bar_ptr=bar)
                        own = own + 1
        else:
            grp = wg - 1
            t = tidx % 128
            me = grp * grid + bidx
            thr_mma = tiled_mma.get_slice(t)
            t_ra = tiled_mma.make_fragment_A(thr_mma.partition_A(s_a))
            t_rb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
            coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, NX)))
            acc = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            part = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            entered = cutlass.Int32(-1)
            scale = cutlass.Float32(1.0)
            own = cutlass.Int32(0)
            for u in cutlass.range(me, self.total_units, workers, unroll=1):
                stage, first, count = self._unit(u)
                if stage != entered:
                    if cutlass.const_expr(self.deps):
                        if t == 0:
                            self._wait_count(mCounters, stage)
                        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                    if cutlass.const_expr(self.act):
                        scale = mAct[stage]  # the previous stage's output: after the wait
                    entered = stage
                acc.fill(0.0)
                for j in cutlass.range(count, unroll=1):
                    get = ring.ring_state(self.stages, self.per, grp, own, False)
                    pipe.consumer_wait(get)
                    warpgroup.fence()
                    tiled_mma = ring.group_mma(tiled_mma, part, t_ra, get.index, t_rb,
                                               get.index)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe.consumer_release(get)
                    for e in cutlass.range_constexpr(cute.size(acc)):
                        acc[e] = acc[e] + part[e] * scale
                    own = own + 1
                for e in cutlass.range_constexpr(cute.size(acc)):
                    if coords[e][1] == 0:  # one row's outputs
                        mOut[u % OUT_ROWS, coords[e][0]] = acc[e]
                # the warpgroup's stores ordered before thread 0's (barrier), then one release
                # at gpu scope covers them all (cumulativity): one fence a unit, not 128
                cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                if t == 0:
                    cute.arch.fence_acq_rel_gpu()
                    cute.arch.atomic_add(mCounters.iterator + stage, cutlass.Int32(1),
                                         sem="release", scope="gpu")


@functools.lru_cache(maxsize=None)
def compiled(stages: tuple, layers: int, sms: int, deps: bool, groups: int = GROUPS,
             act: bool = True, min_chunk: int = 1):
    """(the chain, its compiled launch) for `stages` ((tiles, late), ...) x `layers`."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    chain = StreamChain(stages, layers, sms, deps, groups, act, min_chunk)
    dummy = (torch.empty(chain.total_tiles * BLOCK_M, BLOCK_K, dtype=torch.float8_e4m3fn),
             torch.empty(NX, BLOCK_K, dtype=torch.float8_e4m3fn),
             torch.empty(OUT_ROWS, BLOCK_M), torch.empty(chain.n_stages),
             torch.empty(chain.n_stages, dtype=torch.int32))
    fn = cute.compile(chain, *(from_dlpack(t, assumed_align=16) for t in dummy), sms,
                      cuda.CUstream(0))
    return chain, fn


def main() -> None:
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    from benchmark.gemv_probe import graph_time
    from benchmark.harness import measure_bandwidth, run_meta, write_json

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--out", default="")
    p.add_argument("--results", default="benchmark/results")
    args = p.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = measure_bandwidth(dev)
    rows = []
    for config, deps, groups, act, min_chunk in ARMS:
        stages = tuple((stage_tiles(mb), late) for _, mb, late in CONFIGS[config])
        layer_bytes = sum(t for t, _ in stages) * TILE_BYTES
        floor_us = layer_bytes / bw * 1e6
        chain, fn = compiled(stages, args.layers, sms, deps, groups, act, min_chunk)
        # bytes 0x00-0x7e: finite e4m3 of either magnitude, never NaN (0x7f, 0xff)
        w = torch.randint(0, 0x7F, (chain.total_tiles * BLOCK_M, BLOCK_K), device=dev,
                          dtype=torch.uint8).view(torch.float8_e4m3fn)
        x = torch.randn(NX, BLOCK_K, device=dev).to(torch.float8_e4m3fn)
        out = torch.zeros(OUT_ROWS, BLOCK_M, device=dev)
        acts = torch.ones(chain.n_stages, device=dev)
        counters = torch.zeros(chain.n_stages, dtype=torch.int32, device=dev)
        targs = [from_dlpack(t, assumed_align=16) for t in (w, x, out, acts, counters)]

        def launch(_):
            counters.zero_()
            fn(*targs, sms, cuda.CUstream(torch.cuda.current_stream().cuda_stream))

        launch(0)
        torch.cuda.synchronize()
        units = torch.tensor(chain.units, dtype=torch.int32, device=dev)
        assert torch.equal(counters, units), (counters.tolist(), chain.units)
        assert torch.isfinite(out).all()
        us = graph_time(launch, 1) / args.layers
        rows.append({"config": config, "arm": "chain" if deps else "stream", "groups": groups,
                     "act_read": act, "min_chunk": min_chunk,
                     "us_per_layer": us, "floor_us": floor_us, "frac_floor": floor_us / us,
                     "stages_per_layer": len(stages),
                     "late_stages": sum(late for _, late in stages),
                     "layer_bytes": layer_bytes, "ring_slots": chain.stages})
        print(f"{config:18s} {rows[-1]['arm']:6s} g{groups} act{int(act)} c{min_chunk:<2d} "
              f"{us:7.2f} us a layer  floor "
              f"{floor_us:5.2f}  {floor_us / us:6.1%}  ({len(stages)} stages)", flush=True)
    meta = {"benchmark": "stream_chain_probe", **run_meta(dev), "bandwidth_TBps": bw / 1e12,
            "layers": args.layers, "nx": NX,
            "configs": {k: [dict(zip(("stage", "mb", "late"), s)) for s in v]
                        for k, v in CONFIGS.items()}}
    write_json("stream_chain_probe", {"meta": meta, "results": rows}, [args.out, args.results])


if __name__ == "__main__":
    main()
