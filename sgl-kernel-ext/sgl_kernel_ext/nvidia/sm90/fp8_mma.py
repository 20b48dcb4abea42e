"""FP8 block-128 linear for 1-16 rows on Hopper's tensor cores: a TMA stream of weight tiles
into a shared-memory ring, multiplied by consumer warpgroups with wgmma (CuTe DSL).

parts fp32 [SPLIT, M, N]: parts[c] = the K chunk c of the block-dequantized xq W^T, the
contract of the Triton stage kernel ``fp8_linear`` (its consumers sum the chunks in order).
W e4m3 [N, K] with scales ws [ceil(N/128), K/128]; xq e4m3 [R, K] with scales sx [M, K/128],
R >= 8 (>= 16 from 9 rows): the TMA reads whole 8- or 16-row x tiles, rows past M feed MMA
columns that are never stored (a step's buffers are allocated for its most rows anyway).

The MMA runs transposed, W tile x xq^T: a 64-row weight tile is wgmma's A operand (m64), the
step's rows are its N (8 or 16), K = 128 a ring slot, so one slot is one scale group. Each
slot's product lands in a scratch accumulator that is scaled by ws[row block, group] *
sx[row, group] and added to the tile's accumulator, the reference's blockwise dequantization
in fp32 (wgmma's own FP8 sums within the group are less precise than fp32: about 2e-4 of
max |y| measured, where the layer rounds to bf16 next).

Work: units are (64-row tile, K chunk); CTA c takes units c, c + grid, ...; its consumer
warpgroups take the units of a round side by side, the producer warp interleaving their slots.
Each output element is one thread's fixed-order sum: deterministic. Launched programmatically
dependent (pdl), the producer fills the ring with weight tiles before waiting for the previous
kernel, and x's tiles after; with a ring of about 90 KB the next launch's CTA fits beside this
one's. Optional row tails: the last K chunk of a tile to finish sums the chunks into bf16 rows.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import ring

MAX_ROWS = 16
BLOCK_M, BLOCK_K = ring.BLOCK_M, ring.BLOCK_K  # a ring slot: 64 weight rows, one scale group
SMEM_BYTES = 200 * 1024
GROUPS = 2  # consumer warpgroups


def x_rows(m: int) -> int:
    """Rows of x the MMA reads for m rows (its N: 8 or 16)."""
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"fp8_mma takes 1..{MAX_ROWS} rows, got {m}")
    return 8 if m <= 8 else 16


def split_for(n: int, k: int, units: int = GROUPS * 132) -> int:
    """K chunks (dividing K / 128) so that tiles x chunks give each consumer warpgroup of the
    GPU about one unit (at most `units`)."""
    tiles, kg = -(-n // BLOCK_M), k // BLOCK_K
    best = 1
    for s in range(1, kg + 1):
        if kg % s == 0 and tiles * s <= units:
            best = s
    return best


class Fp8SkinnyMma:
    """One compiled shape: m rows, an [n, k] matrix in `split` K chunks."""

    def __init__(self, m: int, n: int, k: int, split: int, stages: int = 0, groups: int = 0,
                 pdl: bool = False, tails: bool = False, n2: int = 0):
        if not 1 <= m <= MAX_ROWS:
            raise ValueError(f"fp8_mma takes 1..{MAX_ROWS} rows, got {m}")
        if k % BLOCK_K:
            raise ValueError(f"K must be a multiple of {BLOCK_K}, got {k}")
        kg = k // BLOCK_K
        if not 1 <= split <= kg or kg % split:
            raise ValueError(f"split must divide K / 128 = {kg}, got {split}")
        self.m, self.n, self.k, self.split = m, n, k, split
        self.nx = x_rows(m)
        self.kg, self.chunk = kg, kg // split
        # a second matrix [n2, k] in the same launch (q_a|kv_a): its tiles follow the first's
        self.n2 = n2
        self.tiles1 = -(-n // BLOCK_M)
        self.tiles = self.tiles1 + -(-n2 // BLOCK_M)
        self.units = self.tiles * split
        self.slot_bytes = (BLOCK_M + self.nx) * BLOCK_K
        self.groups = groups or GROUPS
        # each consumer warpgroup has its own `per` slots of the ring (ring.py says why)
        if stages and stages % self.groups:
            raise ValueError(f"fp8_mma: stages ({stages}) must be a multiple of the consumer "
                             f"warpgroups ({self.groups})")
        self.per = (stages // self.groups if stages
                    else (SMEM_BYTES - 2048) // self.slot_bytes // self.groups)
        self.stages = self.per * self.groups
        self.threads = 128 * (1 + self.groups)  # warpgroup 0: the producer warp
        # launched programmatically dependent on the previous kernel: the producer fills the
        # ring with weight tiles before waiting for it (they do not depend on it), x after
        self.pdl = pdl
        # the last K chunk of each row tile to finish sums the tile's chunks into bf16 rows
        self.tails = tails
        if tails and n2:
            raise ValueError("fp8_mma: row tails take one matrix a launch")

    @cute.jit
    def __call__(self, w: cute.Tensor, ws: cute.Tensor, xq: cute.Tensor, sx: cute.Tensor,
                 parts: cute.Tensor, arrivals: cute.Tensor, rows: cute.Tensor, w2: cute.Tensor,
                 ws2: cute.Tensor, parts2: cute.Tensor, grid: cutlass.Int32, stream):
        e4m3 = cutlass.Float8E4M3FN
        tiled_mma, a_layout, b_layout = ring.mma_and_layouts(self.nx, self.stages, self.stages)
        tma_a, tma_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w, cute.slice_(a_layout, (None, None, 0)),
            (BLOCK_M, BLOCK_K))
        tma_b, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), xq, cute.slice_(b_layout, (None, None, 0)),
            (self.nx, BLOCK_K))
        tma_a2, tma_w2 = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w2, cute.slice_(a_layout, (None, None, 0)),
            (BLOCK_M, BLOCK_K))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sa: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(a_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(b_layout)], 1024]
            last: cute.struct.MemRange[cutlass.Int32, self.groups]

        self.storage = Storage
        self.kernel(tma_a, tma_w, tma_b, tma_x, tiled_mma, a_layout, b_layout, ws, sx,
                    parts, arrivals, rows, tma_a2, tma_w2, ws2, parts2).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1],
                                  smem=Storage.size_in_bytes(), stream=stream,
                                  use_pdl=self.pdl)

    def _slot(self, f, bidx, grid, my_units):
        """(row tile, scale group, ring state) of a CTA's f-th slot: its units go in rounds
        of `groups` (one a consumer warpgroup), a round's slots interleaved group by group,
        each into its warpgroup's part of the ring."""
        k, g_in, c, own = ring.round_slot(f, self.groups, self.chunk, my_units)
        unit = bidx + k * grid
        return (unit // self.split, (unit % self.split) * self.chunk + g_in,
                ring.ring_state(self.stages, self.per, c, own, True))

    @cute.jit
    def _w_scale(self, mWs: cute.Tensor, mWs2: cute.Tensor, row_tile, group):
        """The weight scale of a row tile's 128-column group, in its own matrix."""
        if cutlass.const_expr(self.n2 == 0):
            return mWs[row_tile * BLOCK_M // 128, group]
        scale = cutlass.Float32(0.0)
        if row_tile < self.tiles1:
            scale = mWs[row_tile * BLOCK_M // 128, group]
        else:
            scale = mWs2[(row_tile - self.tiles1) * BLOCK_M // 128, group]
        return scale

    @cute.jit
    def _store(self, acc: cute.Tensor, coords: cute.Tensor, c, row_tile, n_rows,
               mParts: cute.Tensor):
        """A unit's accumulator into its K chunk of parts (rows past M or N not stored)."""
        for e in cutlass.range_constexpr(cute.size(acc)):
            n = row_tile * BLOCK_M + coords[e][0]
            if coords[e][1] < self.m and n < n_rows:
                mParts[c, coords[e][1], n] = acc[e]

    @cute.jit
    def _load_w(self, tma_a: cute.CopyAtom, t_ga: cute.Tensor, t_sa: cute.Tensor,
                tma_a2: cute.CopyAtom, t_ga2: cute.Tensor, t_sa2: cute.Tensor, row_tile,
                group, index, bar):
        """TMA of a weight tile into ring slot `index`: the first matrix's, or past its tiles
        the second's."""
        if cutlass.const_expr(self.n2 == 0):
            cute.copy(tma_a, t_ga[(None, row_tile, group)], t_sa[(None, index)], tma_bar_ptr=bar)
        else:
            if row_tile < self.tiles1:
                cute.copy(tma_a, t_ga[(None, row_tile, group)], t_sa[(None, index)],
                          tma_bar_ptr=bar)
            else:
                cute.copy(tma_a2, t_ga2[(None, row_tile - self.tiles1, group)],
                          t_sa2[(None, index)], tma_bar_ptr=bar)

    @cute.jit
    def _row_tail(self, last: cute.Tensor, grp, t, row_tile, mParts: cute.Tensor,
                  mArrivals: cute.Tensor, mRows: cute.Tensor):
        """After a warpgroup stored its unit's chunk: one arrival for the row tile (release);
        the warpgroup that brings the tile's last chunk sums the chunks in order into bf16
        rows [M, N] (acquire) and leaves the tile's counter at zero for the next launch."""
        ring.arrive(last, grp, t, mArrivals.iterator + row_tile, self.split)
        if last[grp] == 1:
            cute.arch.fence_acq_rel_gpu()
            for i in cutlass.range(t, BLOCK_M * self.m, 128, unroll=1):
                n = row_tile * BLOCK_M + i // self.m
                row = i % self.m
                if n < self.n:
                    total = mParts[0, row, n]
                    for c in cutlass.range_constexpr(1, self.split):
                        total = total + mParts[c, row, n]
                    mRows[row, n] = total.to(cutlass.BFloat16)
            if t == 0:
                mArrivals[row_tile] = cutlass.Int32(0)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mW: cute.Tensor, tma_b: cute.CopyAtom,
               mX: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               b_layout: cute.ComposedLayout, mWs: cute.Tensor, mSx: cute.Tensor,
               mParts: cute.Tensor, mArrivals: cute.Tensor, mRows: cute.Tensor,
               tma_a2: cute.CopyAtom, mW2: cute.Tensor, mWs2: cute.Tensor,
               mParts2: cute.Tensor):
        stages, groups, chunk = self.stages, self.groups, self.chunk
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr(self.n2 > 0):
                cpasync.prefetch_descriptor(tma_a2)

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        s_a = storage.sa.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        s_b = storage.sb.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        pipe = ring.make_pipe(storage.bars.data_ptr(), stages, self.slot_bytes)

        g_a = cute.local_tile(mW, (BLOCK_M, BLOCK_K), (None, None))
        g_b = cute.local_tile(mX, (self.nx, BLOCK_K), (None, None))
        t_sa, t_ga = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                           cute.group_modes(s_a, 0, 2), cute.group_modes(g_a, 0, 2))
        t_sb, t_gb = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                           cute.group_modes(s_b, 0, 2), cute.group_modes(g_b, 0, 2))
        t_sa2, t_ga2 = cpasync.tma_partition(
            tma_a2, 0, cute.make_layout(1), cute.group_modes(s_a, 0, 2),
            cute.group_modes(cute.local_tile(mW2, (BLOCK_M, BLOCK_K), (None, None)), 0, 2))
        my_units = (self.units - bidx + grid - 1) // grid
        rounds = (my_units + groups - 1) // groups
        total = my_units * chunk

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        if warp == 0:
            if cutlass.const_expr(self.pdl):
                # the first lap of every warpgroup's ring: weight tiles before the wait, x's
                # after (the previous kernel's output)
                for f in cutlass.range(total, unroll=1):
                    row_tile, group, put = self._slot(f, bidx, grid, my_units)
                    if put.count < self.per:
                        pipe.producer_acquire(put)
                        self._load_w(tma_a, t_ga, t_sa, tma_a2, t_ga2, t_sa2, row_tile, group,
                                     put.index, pipe.producer_get_barrier(put))
                cute.arch.griddepcontrol_wait()
                for f in cutlass.range(total, unroll=1):
                    row_tile, group, put = self._slot(f, bidx, grid, my_units)
                    if put.count < self.per:
                        cute.copy(tma_b, t_gb[(None, 0, group)], t_sb[(None, put.index)],
                                  tma_bar_ptr=pipe.producer_get_barrier(put))
            for f in cutlass.range(total, unroll=1):
                row_tile, group, put = self._slot(f, bidx, grid, my_units)
                load = cutlass.Boolean(True)
                if cutlass.const_expr(self.pdl):
                    load = put.count >= self.per  # not loaded before the wait
                if load:
                    pipe.producer_acquire(put)
                    bar = pipe.producer_get_barrier(put)
                    self._load_w(tma_a, t_ga, t_sa, tma_a2, t_ga2, t_sa2, row_tile, group,
                                 put.index, bar)
                    cute.copy(tma_b, t_gb[(None, 0, group)], t_sb[(None, put.index)],
                              tma_bar_ptr=bar)
        elif wg >= 1:
            grp = wg - 1
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()  # sx, and parts the previous kernel may read
            thr_mma = tiled_mma.get_slice(tidx % 128)
            t_ra = tiled_mma.make_fragment_A(thr_mma.partition_A(s_a))
            t_rb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
            coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, self.nx)))
            acc = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            part = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            for rnd in cutlass.range(rounds, unroll=1):
                in_round = cutlass.min(groups, my_units - rnd * groups)
                if grp < in_round:
                    unit = bidx + (rnd * groups + grp) * grid
                    row_tile = unit // self.split
                    c = unit % self.split
                    acc.fill(0.0)
                    for s in cutlass.range(chunk, unroll=1):
                        get = ring.ring_state(stages, self.per, grp, rnd * chunk + s, False)
                        group = c * chunk + s
                        # the slot's scales, loaded before its data is waited for
                        w_scale = self._w_scale(mWs, mWs2, row_tile, group)
                        scale = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
                        for e in cutlass.range_constexpr(cute.size(acc)):
                            scale[e] = w_scale * mSx[cutlass.min(coords[e][1], self.m - 1),
                                                     group]
                        pipe.consumer_wait(get)
                        warpgroup.fence()
                        tiled_mma = ring.group_mma(tiled_mma, part, t_ra, get.index, t_rb,
                                                   get.index)
                        warpgroup.commit_group()
                        warpgroup.wait_group(0)
                        pipe.consumer_release(get)
                        for e in cutlass.range_constexpr(cute.size(acc)):
                            acc[e] = acc[e] + part[e] * scale[e]
                    if cutlass.const_expr(self.n2 == 0):
                        self._store(acc, coords, c, row_tile, self.n, mParts)
                    else:
                        if row_tile < self.tiles1:
                            self._store(acc, coords, c, row_tile, self.n, mParts)
                        else:
                            self._store(acc, coords, c, row_tile - self.tiles1, self.n2,
                                        mParts2)
                    if cutlass.const_expr(self.tails):
                        self._row_tail(storage.last.get_tensor(cute.make_layout(groups)), grp,
                                       tidx % 128, row_tile, mParts, mArrivals, mRows)


@functools.lru_cache(maxsize=None)
def _compiled(m: int, n: int, k: int, split: int, stages: int, groups: int, pdl: bool = False,
              tails: bool = False, n2: int = 0):
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    mma = Fp8SkinnyMma(m, n, k, split, stages, groups, pdl, tails, n2)
    e4m3 = torch.float8_e4m3fn
    second = n2 or n  # without a second matrix the first stands in (never read as one)
    dummy = (torch.empty(n, k, dtype=e4m3), torch.empty(-(-n // 128), k // 128),
             torch.empty(mma.nx, k, dtype=e4m3), torch.empty(m, k // 128),
             torch.empty(split, m, n), torch.empty(mma.tiles1, dtype=torch.int32),
             torch.empty(m, n, dtype=torch.bfloat16), torch.empty(second, k, dtype=e4m3),
             torch.empty(-(-second // 128), k // 128), torch.empty(split, m, second))
    fn = cute.compile(mma, *(from_dlpack(t, assumed_align=16) for t in dummy), 1,
                      cuda.CUstream(0))
    return mma, fn


@functools.lru_cache(maxsize=None)
def _untouched(device, tiles: int, m: int, n: int):
    """Arguments of the shapes a launch without tails is compiled for, which it never reads
    (made once, outside any graph capture)."""
    import torch
    return (torch.zeros(tiles, dtype=torch.int32, device=device),
            torch.zeros(m, n, dtype=torch.bfloat16, device=device))


def _check(name: str, t, shape: tuple, dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"fp8_mma: {name} must be a contiguous {dtype} {shape}, got "
                         f"{t.dtype} {tuple(t.shape)}")


def fp8_mma(xq, sx, wq, ws, parts, stages: int = 0, grid: int = 0, groups: int = 0,
            pdl: bool = False, tails=None, wq2=None, ws2=None, parts2=None) -> None:
    """parts fp32 [SPLIT, M, N] = the K chunks of xq W^T (the module docstring) on the current
    torch stream; graph-capturable. xq e4m3 [R >= x_rows(M), K] (rows past M are read and
    ignored), sx fp32 [M, K/128], wq e4m3 [N, K], ws fp32 [ceil(N/128), K/128], all
    contiguous; M in 1..16; SPLIT divides K / 128.
    pdl: launch programmatically dependent on the previous kernel in the stream, streaming
    weights into shared memory before waiting for it (``stages`` then sets how much).
    tails = (arrivals int32 [ceil(N/64)] at zero, rows bf16 [M, N]): the last K chunk of each
    64-row tile to finish also sums the tile's chunks (in order, fp32) into rows, as
    ``fp8_linear``'s row tails do, and leaves arrivals at zero.
    wq2, ws2, parts2: a second matrix [N2, K] of the same x in the same launch (q_a|kv_a),
    parts2 [SPLIT, M, N2]; not with tails."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    split, m, n = parts.shape
    k = wq.shape[1]
    nx = x_rows(m)
    if xq.shape[0] < nx:
        raise ValueError(f"fp8_mma: xq needs at least {nx} rows for {m} (the MMA's x tile), "
                         f"got {xq.shape[0]}")
    xq = xq[:nx]
    _check("xq", xq, (nx, k), torch.float8_e4m3fn)
    _check("sx", sx, (m, k // 128), torch.float32)
    _check("wq", wq, (n, k), torch.float8_e4m3fn)
    _check("ws", ws, (-(-n // 128), k // 128), torch.float32)
    _check("parts", parts, (split, m, n), torch.float32)
    if tails is not None:
        arrivals, rows = tails
        _check("tails' arrivals", arrivals, (-(-n // 64),), torch.int32)
        _check("tails' rows", rows, (m, n), torch.bfloat16)
    else:
        arrivals, rows = _untouched(parts.device, -(-n // 64), m, n)
    n2 = 0
    if wq2 is not None:
        n2 = wq2.shape[0]
        _check("wq2", wq2, (n2, k), torch.float8_e4m3fn)
        _check("ws2", ws2, (-(-n2 // 128), k // 128), torch.float32)
        _check("parts2", parts2, (split, m, n2), torch.float32)
    else:
        wq2, ws2, parts2 = wq, ws, parts
    grid = grid or torch.cuda.get_device_properties(parts.device).multi_processor_count
    _, fn = _compiled(m, n, k, split, stages, groups, pdl, tails is not None, n2)
    stream = cuda.CUstream(torch.cuda.current_stream(parts.device).cuda_stream)
    fn(*(from_dlpack(t, assumed_align=16)
         for t in (wq, ws, xq, sx, parts, arrivals, rows, wq2, ws2, parts2)), grid, stream)
