"""Probe: what a split-K reduction hop costs when a tile's K chunks meet in a cluster's
distributed shared memory rather than in global memory (CuTe DSL, sm_90).

attn_side's trace prices its c_q hop at ~4.4 us at one row (its module docstring): the chunks'
atomic arrival, the last chunk's reload of the others' partials from L2, the sums, a flag, a
consumer seeing it. tile_owner_probe showed the split across SMs must stay (a CTA streams at
most ~1/132 of HBM). Here only the hop runs, no weights stream: T tiles of C chunks, one CTA a
chunk (one a SM: each CTA asks for 120 KB of shared memory, as the ring kernels take), each
holding an M x 64 partial (int32, so every sum is exact and checked). All CTAs first meet at
a grid-wide count (t0), then

  global: each stores its partial and makes one acq_rel arrival on its tile's count; the last
          to arrive reloads the C partials, sums them in chunk order, stores the tile's sums
          and then its flag (the launch's epoch);
  dsmem:  a tile's C chunks are one cluster; the others st.async their partial into the
          leader's shared memory, each store completing on the leader's mbarrier; the leader
          sums them in chunk order and stores the tile's sums and then its flag;

and every CTA waits for the next tile's flag, a consumer on another SM (t2). Reported (us,
medians and maxima over tiles and launches): `reduce`, a tile's flag stored after its latest
chunk's t0; `seen`, t2 after t0; `launch`, the last t2 after the first t0. Without weights
streaming beside it the memory system is idle: attn_side measured its hops under load, where
each global round trip was slower.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.cluster_hop_probe --out $OUT

Measured on an H200 (results/cluster_hop_probe_20261204T164607Z at 8c3f4d4, 32 tiles; T164657Z
at 0bb1787, every SM), medians in us:

    rows  chunks  tiles   reduce global / dsmem   seen global / dsmem
     1      2      32        1.44 / 0.51             2.14 / 1.31
     1      3      32        1.47 / 0.51             2.27 / 1.41
     1      2      66        1.44 / 0.51             2.53 / 1.70
    16      2      32        1.60 / 0.70             2.40 / 1.41
    16      3      32        1.79 / 0.77             2.66 / 1.60
    16      2      66        1.63 / 0.70             2.69 / 1.76
     1 / 16  4 / 6  32 / 22   1.57-2.40 / -          2.37-3.14 / -

so a reduction through the cluster takes a third of the global one (0.5-0.8 against 1.4-2.4
us) and a hop ~0.9-1.3 us less; but at one CTA a multiprocessor only clusters of 2 cover the
H200's 132 SMs (66 of them); 44 clusters of 3, 32 of 4 and 22 of 6 were never all resident
together (the dsmem waits gave up), while 32 clusters of 3 (96 CTAs) were.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import cutlass
import cutlass.cute as cute
import cutlass.memory

MODES = ("global", "dsmem")
THREADS = 128
PAD_BYTES = 120 * 1024  # one CTA a multiprocessor, as attn_side's and fp8_mma's
SPIN_LIMIT = 1 << 22  # polls before a wait gives up (the probe then reports the form failed)
T0, T1, T2 = 0, 1, 2  # trace columns: start, flag stored (leader / last), next tile's flag seen


class HopProbe:
    """One form: `mode`, m rows a partial (m x 64 int32), `chunks` CTAs a tile, `tiles`."""

    def __init__(self, mode: str, m: int, chunks: int, tiles: int):
        if mode not in MODES:
            raise ValueError(f"cluster_hop_probe: mode {mode!r} is not one of {MODES}")
        self.mode, self.m, self.chunks, self.tiles = mode, m, chunks, tiles
        self.p = m * 64
        self.per = -(-self.p // THREADS)  # values a thread holds
        self.grid = chunks * tiles

    @cute.jit
    def __call__(self, sync: cute.Tensor, parts: cute.Tensor, out: cute.Tensor,
                 trace: cute.Tensor, epoch: cutlass.Int32, stream):
        @cute.struct
        class Storage:
            bar: cute.struct.MemRange[cutlass.Int64, 1]
            last: cute.struct.MemRange[cutlass.Int32, 1]
            buf: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, self.chunks * self.p],
                                   16]
            pad: cute.struct.MemRange[cutlass.Int8, PAD_BYTES]

        self.storage = Storage
        cluster = [self.chunks, 1, 1] if self.mode == "dsmem" else [1, 1, 1]
        self.kernel(sync, parts, out, trace, epoch).launch(
            grid=[self.grid, 1, 1], block=[THREADS, 1, 1], cluster=cluster,
            smem=Storage.size_in_bytes(), stream=stream)

    @cute.jit
    def _spin(self, word: cute.Pointer, target, sync: cute.Tensor, at_least: cutlass.Constexpr):
        """Thread 0 polls `word` until it reaches (at_least) or equals target; sync[1] is set
        where it gave up."""
        spins = cutlass.Int32(0)
        seen = cute.arch.load(word, cutlass.Int32, sem="relaxed", scope="gpu")
        if cutlass.const_expr(at_least):
            while seen < target and spins < SPIN_LIMIT:
                seen = cute.arch.load(word, cutlass.Int32, sem="relaxed", scope="gpu")
                spins = spins + 1
            if seen < target:
                sync[1] = cutlass.Int32(1)
        else:
            while seen != target and spins < SPIN_LIMIT:
                seen = cute.arch.load(word, cutlass.Int32, sem="relaxed", scope="gpu")
                spins = spins + 1
            if seen != target:
                sync[1] = cutlass.Int32(1)
        cute.arch.fence_acq_rel_gpu()

    @cute.kernel
    def kernel(self, sync: cute.Tensor, parts: cute.Tensor, out: cute.Tensor,
               trace: cute.Tensor, epoch: cutlass.Int32):
        # sync: [0] the start count (grid x epoch after each launch's meeting), [1] a wait
        # gave up, [2 + tile] a tile's arrivals (global), [2 + tiles + tile] its flag
        t, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        tile = cta // self.chunks
        chunk = cta % self.chunks
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        bar = storage.bar.data_ptr()
        last = storage.last.get_tensor(cute.make_layout(1))
        buf = storage.buf.get_tensor(cute.make_layout((self.p, self.chunks), stride=(1, self.p)))
        if cutlass.const_expr(self.mode == "dsmem"):
            if t == 0:
                cute.arch.mbarrier_init(bar, 1)
                cute.arch.mbarrier_init_fence()
                if chunk == 0:
                    cute.arch.mbarrier_arrive_and_expect_tx(bar, (self.chunks - 1) * self.p * 4)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        # the partial: exact int32 values the host can sum
        vals = cute.make_rmem_tensor(cute.make_layout(self.per), cutlass.Int32)
        for j in cutlass.range_constexpr(self.per):
            vals[j] = cta * 100000 + t + THREADS * j
        # every CTA meets the others first, so the hop starts together
        if t == 0:
            cute.arch.atomic_add(sync.iterator, cutlass.Int32(1), sem="relaxed", scope="gpu")
            self._spin(sync.iterator, self.grid * epoch, sync, True)
            trace[cta, T0] = cute.arch.globaltimer().to(cutlass.Int64)
        cute.arch.barrier()
        flag = sync.iterator + 2 + self.tiles + tile
        leader = cutlass.Boolean(False)
        if cutlass.const_expr(self.mode == "global"):
            for j in cutlass.range_constexpr(self.per):
                i = t + THREADS * j
                if i < self.p:
                    parts[cta, i] = vals[j]
            cute.arch.barrier()  # the CTA's stores before thread 0's release
            if t == 0:
                old = cute.arch.atomic_add(sync.iterator + 2 + tile, cutlass.Int32(1),
                                           sem="acq_rel", scope="gpu")
                last[0] = cutlass.Int32(0)
                if old == self.chunks - 1:
                    last[0] = cutlass.Int32(1)
                    sync[2 + tile] = cutlass.Int32(0)
            cute.arch.barrier()
            leader = last[0] == 1
            if leader:
                cute.arch.fence_acq_rel_gpu()
                got = cute.make_rmem_tensor(cute.make_layout((self.per, self.chunks)),
                                            cutlass.Int32)
                for j in cutlass.range_constexpr(self.per):  # every load before any sum
                    i = cutlass.min(t + THREADS * j, self.p - 1)
                    for c in cutlass.range_constexpr(self.chunks):
                        got[j, c] = parts[tile * self.chunks + c, i]
                for j in cutlass.range_constexpr(self.per):
                    total = got[j, 0]
                    for c in cutlass.range_constexpr(1, self.chunks):
                        total = total + got[j, c]
                    i = t + THREADS * j
                    if i < self.p:
                        out[tile, i] = total
        else:
            leader = chunk == 0
            if leader:
                for j in cutlass.range_constexpr(self.per):
                    i = t + THREADS * j
                    if i < self.p:
                        buf[i, 0] = vals[j]
                cute.arch.mbarrier_wait(bar, 0)
                cute.arch.barrier()  # the leader's own partial, written by its threads
                for j in cutlass.range_constexpr(self.per):
                    i = t + THREADS * j
                    if i < self.p:
                        total = buf[i, 0]
                        for c in cutlass.range_constexpr(1, self.chunks):
                            total = total + buf[i, c]
                        out[tile, i] = total
            else:
                for j in cutlass.range_constexpr(self.per):
                    i = t + THREADS * j
                    if i < self.p:
                        cute.arch.store_async_dsmem(
                            storage.buf.data_ptr() + (chunk * self.p + i), vals[j], bar, 0)
        if leader:
            cute.arch.barrier()  # the tile's sums before thread 0's flag
            if t == 0:
                cute.arch.fence_acq_rel_gpu()
                cute.arch.store(flag, epoch, sem="relaxed", scope="gpu")
                trace[cta, T1] = cute.arch.globaltimer().to(cutlass.Int64)
        if t == 0:
            nxt = (tile + 1) % self.tiles
            self._spin(sync.iterator + 2 + self.tiles + nxt, epoch, sync, False)
            trace[cta, T2] = cute.arch.globaltimer().to(cutlass.Int64)


@functools.lru_cache(maxsize=None)
def compiled(mode: str, m: int, chunks: int, tiles: int):
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    probe = HopProbe(mode, m, chunks, tiles)
    dummy = (torch.empty(2 + 2 * tiles, dtype=torch.int32),
             torch.empty(probe.grid, probe.p, dtype=torch.int32),
             torch.empty(tiles, probe.p, dtype=torch.int32),
             torch.empty(probe.grid, 3, dtype=torch.int64))
    fn = cute.compile(probe, *(from_dlpack(t, assumed_align=16) for t in dummy), 1,
                      cuda.CUstream(0))
    return probe, fn


def expected_sums(probe: HopProbe, device):
    """The tiles' sums the kernel must store: the sum over a tile's chunks of each CTA's
    values (cta * 100000 + index)."""
    import torch
    idx = torch.arange(probe.p, dtype=torch.int64, device=device)
    cta = torch.arange(probe.grid, dtype=torch.int64, device=device).view(probe.tiles,
                                                                          probe.chunks)
    return (cta.sum(1, keepdim=True) * 100000 + probe.chunks * idx).to(torch.int32)


def run_form(mode: str, m: int, chunks: int, tiles: int, launches: int, device) -> dict:
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    probe, fn = compiled(mode, m, chunks, tiles)
    sync = torch.zeros(2 + 2 * tiles, dtype=torch.int32, device=device)
    parts = torch.zeros(probe.grid, probe.p, dtype=torch.int32, device=device)
    out = torch.zeros(tiles, probe.p, dtype=torch.int32, device=device)
    trace = torch.zeros(probe.grid, 3, dtype=torch.int64, device=device)
    want = expected_sums(probe, device)
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    args = [from_dlpack(t, assumed_align=16) for t in (sync, parts, out, trace)]
    reduce, seen, whole = [], [], []
    for epoch in range(1, launches + 1):
        out.fill_(-1)
        trace.zero_()
        fn(*args, epoch, stream)
        torch.cuda.synchronize()
        if int(sync[1]):
            return {"mode": mode, "m": m, "chunks": chunks, "tiles": tiles,
                    "failed": "a wait gave up (were all CTAs / clusters resident?)"}
        if not torch.equal(out, want):
            raise AssertionError(f"{mode} m={m} C={chunks}: wrong tile sums at launch {epoch}")
        if epoch <= 3:  # warm-up launches (compile, first touch) are not counted
            continue
        tr = trace.cpu().view(tiles, chunks, 3)
        t0 = tr[..., T0]
        for tl in range(tiles):
            stored = int(tr[tl, :, T1].max())
            reduce.append((stored - int(t0[tl].max())) / 1e3)
        seen.extend(((tr[..., T2] - t0) / 1e3).flatten().tolist())
        whole.append((int(tr[..., T2].max()) - int(t0.min())) / 1e3)

    def stats(xs):
        xs = sorted(xs)
        return {"median": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))],
                "max": xs[-1]}

    return {"mode": mode, "m": m, "chunks": chunks, "tiles": tiles, "grid": probe.grid,
            "launches": launches - 3, "reduce_us": stats(reduce), "seen_us": stats(seen),
            "launch_us": stats(whole)}


def main() -> None:
    import torch

    from benchmark.harness import run_meta, write_json

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--chunks", default="2,3,4,6")
    ap.add_argument("--launches", type=int, default=23)
    ap.add_argument("--tiles", type=int, default=32,
                    help="tiles (at most the SMs / chunks; 0: as many as fit the SMs)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for m in map(int, args.ms.split(",")):
        for chunks in map(int, args.chunks.split(",")):
            tiles = min(args.tiles or sms, sms // chunks)
            for mode in MODES:
                r = run_form(mode, m, chunks, tiles, args.launches, dev)
                rows.append(r)
                if "failed" in r:
                    print(f"m={m:2d} C={chunks} {mode:6s}: {r['failed']}", flush=True)
                    continue
                print(f"m={m:2d} C={chunks} x {tiles} tiles {mode:6s}: reduce "
                      f"{r['reduce_us']['median']:5.2f} (max {r['reduce_us']['max']:5.2f}) us, "
                      f"seen {r['seen_us']['median']:5.2f} (max {r['seen_us']['max']:5.2f}), "
                      f"launch {r['launch_us']['median']:5.2f}", flush=True)
    meta = run_meta(dev)
    meta.update(benchmark="cluster_hop_probe")
    write_json("cluster_hop_probe", {"meta": meta, "results": rows}, [args.out])


if __name__ == "__main__":
    main()
