"""FP8 block-128 GEMV for 1-4 rows on Hopper: a TMA weight stream into a shared-memory ring,
read by CUDA-core warps (CuTe DSL).

y fp32 [M, N] = xq [M, K] . W^T with W e4m3 [N, K] (scales ws [ceil(N/128), K/128]) and xq
e4m3 (scales sx [M, K/128]): y[m, n] = sum over 128-column groups g of
ws[n / 128, g] * sx[m, g] * (xq[m, g] . W[n, g]), the reference's blockwise dequantization.

Why: the Triton stage kernels load their weights with ordinary loads, software-pipelined a few
iterations deep, and reach 30-41% of the copy bandwidth on one decode layer's matrices. Here one
producer warp keeps `stages` tiles of [BN rows x BK columns] in flight per multiprocessor
through the bulk tensor copy engine (TMA), independent of the consumers' progress, which is the
weight stream a persistent layer kernel needs (a producer that runs ahead of the activations).

Work: the grid is one CTA per multiprocessor; CTA c takes the row tiles c, c + grid, ... each
over the whole K, so every output element is one thread group's fixed-order sum (deterministic,
no split-K partials). A consumer thread owns 16 columns of one tile row a ring slot: it
converts them to fp32, dots them with each row of x, and accumulates the dot scaled by the
group's two scales; the BK / 16 threads of a tile row sum their accumulators by shuffles.
"""

from __future__ import annotations

import functools
from typing import Tuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
from cutlass.cute.nvgpu import cpasync

MAX_ROWS = 4  # CUDA-core dots: past a few rows the tensor cores' MMAs are the right tool
BLOCK_N = 16  # tile rows: o_proj's 6144 rows are 384 tiles, 2.9 a multiprocessor
SMEM_BYTES = 200 * 1024  # of the 227 KB a CTA may hold on an H200: ring, x and the scales
SEG = 16  # bytes (e4m3 columns) a consumer thread owns a slot: one 128-bit shared load
ROW_THREADS = 16  # tile rows a consumer group's threads cover at once (each BK / SEG threads)
GROUPS = 2  # consumer groups: each takes every GROUPS-th of the CTA's tiles, in parallel


def block_k(k: int) -> int:
    """Columns a ring slot holds: 256 where K allows (one TMA box), else 128."""
    if k % 128:
        raise ValueError(f"K must be a multiple of the 128-column scale group, got {k}")
    return 256 if k % 256 == 0 else 128


class Fp8Gemv:
    """One compiled shape: rows m, matrix [n, k]. Call with CuTe tensors (see `fp8_gemv`)."""

    def __init__(self, m: int, n: int, k: int, stages: int = 0, groups: int = 0,
                 block_n: int = 0, dry: bool = False):
        if not 1 <= m <= MAX_ROWS:
            raise ValueError(f"fp8_gemv takes 1..{MAX_ROWS} rows, got {m}")
        self.m, self.n, self.k = m, n, k
        self.bn, self.bk = block_n or BLOCK_N, block_k(k)
        self.dry = dry  # probe only: the consumers wait and release without multiplying
        self.kg = k // 128
        self.n_blocks = (n + 127) // 128
        self.tile_bytes = self.bn * self.bk
        extras = m * k + 4 * (m + self.n_blocks) * self.kg + 1024
        self.stages = stages or (SMEM_BYTES - extras) // self.tile_bytes
        if self.stages < 2:
            raise ValueError(f"fp8_gemv: x and the scales of a [{n}, {k}] matrix leave no "
                             f"room for a weight ring in {SMEM_BYTES} bytes of shared memory")
        self.groups = groups or GROUPS
        self.segs = self.bk // SEG  # threads a tile row
        self.rows_per_thread = self.bn // ROW_THREADS
        assert self.bn % ROW_THREADS == 0
        self.per_group = ROW_THREADS * self.segs
        assert self.per_group % 32 == 0 and self.segs <= 32
        self.group_warps = self.per_group // 32
        self.consumers = self.groups * self.per_group
        self.threads = 32 + self.consumers  # warp 0 produces
        # each consumer's share of x, its scales and the weight scales (shared-memory copies)
        self.x_iters = -(-m * (k // SEG) // self.consumers)
        self.sx_iters = -(-m * self.kg // self.consumers)
        self.ws_iters = -(-self.n_blocks * self.kg // self.consumers)

    @cute.jit
    def __call__(self, w: cute.Tensor, ws: cute.Tensor, xq: cute.Tensor, sx: cute.Tensor,
                 y: cute.Tensor, grid: cutlass.Int32, stream):
        smem_tile = cute.make_layout((self.bn, self.bk), stride=(self.bk, 1))
        tma_atom, tma_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w, smem_tile, (self.bn, self.bk))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            ring: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float8E4M3FN, self.tile_bytes * self.stages], 128]
            x: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, self.m * self.k], 16]
            sx: cute.struct.MemRange[cutlass.Float32, self.m * self.kg]
            ws: cute.struct.MemRange[cutlass.Float32, self.n_blocks * self.kg]

        self.storage = Storage
        self.kernel(tma_atom, tma_w, ws, xq, sx, y).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], smem=Storage.size_in_bytes(),
            stream=stream)

    @cute.kernel
    def kernel(self, tma_atom: cute.CopyAtom, mW: cute.Tensor, mWs: cute.Tensor,
               mX: cute.Tensor, mSx: cute.Tensor, mY: cute.Tensor):
        bn, bk, segs, stages, groups = self.bn, self.bk, self.segs, self.stages, self.groups
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_atom)

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        ring = storage.ring.get_tensor(
            cute.make_layout((bn, bk, stages), stride=(bk, 1, bn * bk)))
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bars.data_ptr(), num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.group_warps),
            tx_count=self.tile_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))

        # (BN, BK, row tiles, column steps) of the weights, and the TMA's view of tile and ring
        g_w = cute.local_tile(mW, (bn, bk), (None, None))
        t_ring, t_w = cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(ring, 0, 2),
            cute.group_modes(g_w, 0, 2))
        row_tiles = (self.n + bn - 1) // bn
        k_steps = self.k // bk
        my_tiles = (row_tiles - bidx + grid - 1) // grid
        # the CTA's tiles go in rounds of `groups`, one a consumer group; a round's slots are
        # interleaved (k-step major) so the groups consume side by side
        rounds = (my_tiles + groups - 1) // groups

        if warp == 0:
            put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
            for rnd in cutlass.range(rounds, unroll=1):
                in_round = cutlass.min(groups, my_tiles - rnd * groups)
                for i in cutlass.range(k_steps * in_round, unroll=1):
                    tile = bidx + (rnd * groups + i % in_round) * grid
                    pipe.producer_acquire(put)
                    cute.copy(tma_atom, t_w[(None, tile, i // in_round)],
                              t_ring[(None, put.index)], tma_bar_ptr=pipe.producer_get_barrier(put))
                    pipe.producer_commit(put)
                    put.advance()
        else:
            c = tidx - 32
            # x, its scales and the weight scales into shared memory (the consumers only)
            s_x = storage.x.get_tensor(cute.make_layout((self.m, self.k), stride=(self.k, 1)))
            s_sx = storage.sx.get_tensor(cute.make_layout((self.m, self.kg), stride=(self.kg, 1)))
            s_ws = storage.ws.get_tensor(
                cute.make_layout((self.n_blocks, self.kg), stride=(self.kg, 1)))
            # every load issued before any store: one memory round trip, not one an element
            kseg = self.k // SEG
            n_x, n_sx, n_ws = self.m * kseg, self.m * self.kg, self.n_blocks * self.kg
            xs, sxs, wss = [], [], []
            for j in cutlass.range_constexpr(self.x_iters):
                i = cutlass.min(c + j * self.consumers, n_x - 1)
                xs.append(cute.local_tile(mX, (1, SEG), (i // kseg, i % kseg)).load())
            for j in cutlass.range_constexpr(self.sx_iters):
                i = cutlass.min(c + j * self.consumers, n_sx - 1)
                sxs.append(mSx[i // self.kg, i % self.kg])
            for j in cutlass.range_constexpr(self.ws_iters):
                i = cutlass.min(c + j * self.consumers, n_ws - 1)
                wss.append(mWs[i // self.kg, i % self.kg])
            for j in cutlass.range_constexpr(self.x_iters):
                i = c + j * self.consumers
                if i < n_x:
                    cute.local_tile(s_x, (1, SEG), (i // kseg, i % kseg)).store(xs[j])
            for j in cutlass.range_constexpr(self.sx_iters):
                i = c + j * self.consumers
                if i < n_sx:
                    s_sx[i // self.kg, i % self.kg] = sxs[j]
            for j in cutlass.range_constexpr(self.ws_iters):
                i = c + j * self.consumers
                if i < n_ws:
                    s_ws[i // self.kg, i % self.kg] = wss[j]
            cute.arch.barrier(barrier_id=1, number_of_threads=self.consumers)

            grp = c // self.per_group
            r = (c % self.per_group) // segs  # and r + 16, r + 32, ... below BLOCK_N
            seg = c % segs
            acc = cute.make_rmem_tensor(cute.make_layout((self.rows_per_thread, self.m)),
                                        cutlass.Float32)
            for rnd in cutlass.range(rounds, unroll=1):
                in_round = cutlass.min(groups, my_tiles - rnd * groups)
                if grp < in_round:
                    n0 = (bidx + (rnd * groups + grp) * grid) * bn + r
                    acc.fill(0.0)
                    for s in cutlass.range(k_steps, unroll=1):
                        seq = rnd * groups * k_steps + s * in_round + grp
                        get = pipeline.PipelineState(stages, seq, seq % stages,
                                                     (seq // stages) % 2)
                        col = s * bk + seg * SEG
                        group = col // 128
                        pipe.consumer_wait(get)
                        slot = ring[(None, None, get.index)]
                        wf = [cute.local_tile(slot, (1, SEG), (r + j * ROW_THREADS, seg)).load()
                              for j in range(self.rows_per_thread)]
                        cute.arch.sync_warp()
                        pipe.consumer_release(get)
                        if cutlass.const_expr(not self.dry):
                            xf = [cute.local_tile(s_x, (1, SEG), (m, col // SEG)).load().to(
                                cutlass.Float32) for m in range(self.m)]
                            x_scale = [s_sx[m, group] for m in range(self.m)]
                            for j in cutlass.range_constexpr(self.rows_per_thread):
                                n_block = cutlass.min((n0 + j * ROW_THREADS) // 128,
                                                      self.n_blocks - 1)
                                w_scale = s_ws[n_block, group]
                                wj = wf[j].to(cutlass.Float32)
                                for m in cutlass.range_constexpr(self.m):
                                    d = (wj * xf[m]).reduce(
                                        cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
                                    acc[j, m] = acc[j, m] + d * (w_scale * x_scale[m])
                    for j in cutlass.range_constexpr(self.rows_per_thread):
                        n = n0 + j * ROW_THREADS
                        for m in cutlass.range_constexpr(self.m):
                            total = cute.arch.warp_reduction_sum(acc[j, m], threads_in_group=segs)
                            if seg == 0 and n < self.n:
                                mY[m, n] = total


@functools.lru_cache(maxsize=None)
def _compiled(m: int, n: int, k: int, stages: int, groups: int, block_n: int = 0,
              dry: bool = False):
    """(kernel, compiled function) for one shape, compiled once (about a second)."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    gemv = Fp8Gemv(m, n, k, stages, groups, block_n, dry)
    dummy = _dummies(m, n, k, torch.device("cpu"))
    args = [from_dlpack(t, assumed_align=16) for t in dummy]
    fn = cute.compile(gemv, *args, 1, _stream_type()(0))
    return gemv, fn


def _stream_type():
    import cuda.bindings.driver as cuda
    return cuda.CUstream


def _dummies(m: int, n: int, k: int, device) -> Tuple:
    import torch
    e4m3 = torch.float8_e4m3fn
    return (torch.empty(n, k, dtype=e4m3, device=device),
            torch.empty((n + 127) // 128, k // 128, device=device),
            torch.empty(m, k, dtype=e4m3, device=device),
            torch.empty(m, k // 128, device=device),
            torch.empty(m, n, device=device))


def fp8_gemv(xq, sx, wq, ws, y, stages: int = 0, grid: int = 0, groups: int = 0,
             block_n: int = 0, dry: bool = False) -> None:
    """y fp32 [M, N] = the block-dequantized xq W^T (see the module docstring) on the current
    torch stream; graph-capturable. xq e4m3 [M, K], sx fp32 [M, K/128], wq e4m3 [N, K],
    ws fp32 [ceil(N/128), K/128], all contiguous; M in 1..4."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    m, k = xq.shape
    n = wq.shape[0]
    for name, t, shape, dtype in (("xq", xq, (m, k), torch.float8_e4m3fn),
                                  ("sx", sx, (m, k // 128), torch.float32),
                                  ("wq", wq, (n, k), torch.float8_e4m3fn),
                                  ("ws", ws, ((n + 127) // 128, k // 128), torch.float32),
                                  ("y", y, (m, n), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"fp8_gemv: {name} must be a contiguous {dtype} {shape}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    grid = grid or torch.cuda.get_device_properties(y.device).multi_processor_count
    _, fn = _compiled(m, n, k, stages, groups, block_n, dry)
    stream = _stream_type()(torch.cuda.current_stream(y.device).cuda_stream)
    fn(*(from_dlpack(t, assumed_align=16) for t in (wq, ws, xq, sx, y)), grid, stream)
