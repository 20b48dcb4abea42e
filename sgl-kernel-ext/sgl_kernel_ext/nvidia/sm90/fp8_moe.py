"""A small-M MoE's experts on Hopper's tensor cores (CuTe DSL): gate/up with SwiGLU, then down
with the routing weights, over the slot table that ``triton.moe.route`` writes (slot 0 the
shared expert, id E; then the experts any row chose; ``num_slots`` on the device).

Both kernels are ``fp8_mma``'s machinery (a producer warp streams 64 x 128 e4m3 weight tiles
and x's 8- or 16-row tile through the TMA into a shared-memory ring; consumer warpgroups
multiply them transposed on wgmma and promote each 128-column group to fp32 with its block
scales), over units the device derives from the step's slot count:

- ``gate_up``: units (slot, 64 intermediate columns, K chunk); a ring slot holds the expert's
  gate and up tiles of the unit and x's tile. The K split is chosen on the device so that the
  step's units give each consumer warpgroup about one (``gate_up_split``; evening the
  busiest consumer's load with more chunks instead was slower in the layer at 8-16 rows on an
  H200, results/tiling_probe_20261202T125720Z at 7d16bd9). Each unit stores its chunk's fp32
  partials (gate and up) at [slot * split + chunk, row, column]; the last unit of each
  (slot, 128 columns) to finish sums the chunks in order, applies SwiGLU (g and u rounded to
  bf16 first, bf16 out, as ``triton.moe``) and quantizes each row's 128 columns as SGLang's
  per-token-group quant (max |a| / 448 one fp32 scale, e4m3 rounded to nearest even): the
  down projection's input, written once.
- ``down``: units (slot, 64 hidden rows), K = the intermediate size in one chunk; stores
  bf16(weight[slot, row] * y) at terms[row, the expert's place in the row's ascending choice]
  for the rows that chose the slot's expert, as ``triton.moe.down`` (whose row sum follows).
- ``experts``: both in one launch. Each CTA takes its gate/up units, then its down units of
  (slot, 128 hidden rows), a ring slot holding the two 64-row down tiles of a 128-column
  group. The producer streams the down tiles as soon as the gate/up tiles are in, so they
  load while the activations are being made. A consumer warpgroup keeps a slot's activations
  and their scales in a buffer of its own while its units stay on that slot: it waits for the
  slot's ready flags (one a (slot, 128 columns) group, set by the gate/up tail after its
  stores), loads them by TMA on its own barrier, and stages its units' weight scales
  DOWN_SCALE_BATCH at a time. Every CTA is resident (grid <= SMs, one CTA a multiprocessor)
  and takes its gate/up units first, so the flags it waits for are always set; the last CTA
  to finish clears them for the next launch. A wait that outlasts WAIT_SPINS polls gives up
  and raises the error word instead of hanging (the outputs are then garbage:
  ``check_flags`` says so). Its terms, activations and scales are bitwise the two launches'.

Routed weights are [E, rows, K] stacks (any expert stride: views of SGLang's w13 work), the
shared expert's its own [rows, K]. Each touched expert's weights are read once a step; every
output element is one thread's fixed-order sum (deterministic). Launched programmatically
dependent (pdl), both wait for the previous kernel before reading the slot table.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import ring
from .fp8_mma import BLOCK_K, BLOCK_M, MAX_ROWS, x_rows

# about fp8_mma's RING_SLOTS, so the next launch's CTA fits beside it; at least 3 slots a
# consumer warpgroup (gate/up: 108 KB; with 2, 3-14% slower at 4-16 rows on an H200,
# results/sm90_moe_probe_20261202T105427Z.json: "sm90 s0" there is 2 a warpgroup, "s6" 3).
# Deeper rings (8 or 10 slots: 4-5 a warpgroup) are no faster, two launches or one, at 1, 4
# and 16 rows (sm90_moe_probe_20261202T143547Z: within -1.0..+0.8 us, s0 the default)
RING_BYTES = 92 * 1024
GROUPS = 2  # consumer warpgroups
GATE_UP, DOWN, EXPERTS = "gate_up", "down", "experts"
# polls of a ready flag (each an L2 round trip, about 1 us) before the wait gives up
WAIT_SPINS = 1 << 22
# the fused kind's down units whose weight scales a consumer warpgroup stages at once
DOWN_SCALE_BATCH = 16


def flags_size(slots: int, inter: int) -> int:
    """int32 words of ``experts``' flags: a ready flag a (slot, 128 intermediate columns),
    the finished-CTA count, the error word."""
    return slots * (inter // 128) + 2


def gate_up_split(slots: int, inter: int, hidden: int, units: int) -> int:
    """K chunks of gate/up for `slots` slots: the most (dividing hidden / 128) that keep
    slots x tiles x chunks within `units` (the kernel computes the same on the device)."""
    pairs, kg = slots * (inter // BLOCK_M), hidden // BLOCK_K
    best = 1
    for s in range(1, kg + 1):
        if kg % s == 0 and pairs * s <= units:
            best = s
    return best


def gate_up_parts_rows(max_slots: int, inter: int, hidden: int, units: int) -> int:
    """Rows (slot, chunk) of gate/up's partials for any slot count up to max_slots."""
    return max(s * gate_up_split(s, inter, hidden, units) for s in range(1, max_slots + 1))


class Fp8ExpertsMma:
    """One compiled form: `kind` (GATE_UP, DOWN or EXPERTS: both in one launch) at m rows,
    experts of [inter, hidden]."""

    def __init__(self, kind: str, m: int, inter: int, hidden: int, experts: int,
                 max_slots: int = 2, terms: int = 1, stages: int = 0, groups: int = 0,
                 pdl: bool = False):
        if kind not in (GATE_UP, DOWN, EXPERTS):
            raise ValueError(f"fp8_moe: kind must be {GATE_UP!r}, {DOWN!r} or {EXPERTS!r}, "
                             f"got {kind!r}")
        if not 1 <= m <= MAX_ROWS:
            raise ValueError(f"fp8_moe takes 1..{MAX_ROWS} rows, got {m}")
        if inter % 128 or hidden % 128:
            raise ValueError(f"fp8_moe: intermediate ({inter}) and hidden ({hidden}) sizes "
                             "must be multiples of 128")
        self.fused = kind == EXPERTS
        self.gate_up = kind in (GATE_UP, EXPERTS)  # the fused kind's first phase is gate/up
        self.m, self.inter, self.hidden, self.experts, self.terms = m, inter, hidden, experts, terms
        self.max_slots = max_slots  # the slot table's length (a copy in shared memory)
        self.table = max_slots * m if kind != GATE_UP else 1  # down's [slot, row] weights, ranks
        # the fused kind's down units: (slot, 128 hidden rows), over inter / 128 groups
        self.d_units, self.d_kg = hidden // 128, inter // BLOCK_K
        self.nx = x_rows(m)
        self.n = inter if self.gate_up else hidden  # one matrix's rows an expert
        self.k = hidden if self.gate_up else inter
        self.tiles = self.n // BLOCK_M  # units of a slot (a chunk each)
        self.kg = self.k // BLOCK_K
        self.a_tiles = 2 if self.gate_up else 1  # gate and up, or down
        self.slot_bytes = (self.a_tiles * BLOCK_M + self.nx) * BLOCK_K
        self.groups = groups or GROUPS
        # each consumer warpgroup has its own `per` slots of the ring (ring.py says why)
        if stages and stages % self.groups:
            raise ValueError(f"fp8_moe: stages ({stages}) must be a multiple of the consumer "
                             f"warpgroups ({self.groups})")
        self.per = (stages // self.groups if stages
                    else max(3, RING_BYTES // (self.slot_bytes * self.groups)))
        self.stages = self.per * self.groups
        self.threads = 128 * (1 + self.groups)
        self.pdl = pdl
        self.scale_groups = max(self.kg, self.d_kg if self.fused else 0)

    @cute.jit
    def __call__(self, wa: cute.Tensor, sa: cute.Tensor, wb: cute.Tensor, sb: cute.Tensor,
                 sh_wa: cute.Tensor, sh_sa: cute.Tensor, sh_wb: cute.Tensor,
                 sh_sb: cute.Tensor, xq: cute.Tensor, sx: cute.Tensor, slot_expert: cute.Tensor,
                 num_slots: cute.Tensor, parts: cute.Tensor, arrivals: cute.Tensor,
                 out_q: cute.Tensor, out_s: cute.Tensor, slot_weight: cute.Tensor,
                 slot_rank: cute.Tensor, terms: cute.Tensor, wd: cute.Tensor, sd: cute.Tensor,
                 sh_wd: cute.Tensor, sh_sd: cute.Tensor, flags: cute.Tensor,
                 grid: cutlass.Int32, stream):
        e4m3 = cutlass.Float8E4M3FN
        tiled_mma, a_layout, b_layout = ring.mma_and_layouts(
            self.nx, self.a_tiles * self.stages, self.stages)
        a_slot = cute.slice_(a_layout, (None, None, 0))
        b_slot = cute.slice_(b_layout, (None, None, 0))
        op = cpasync.CopyBulkTensorTileG2SOp()
        # the fused kind's down tiles and activations; the others pass placeholders
        mats = (wa, wb, sh_wa, sh_wb) + ((wd, sh_wd) if self.fused else (wa, wa))
        tma = [cpasync.make_tiled_tma_atom(op, w, a_slot, (BLOCK_M, BLOCK_K)) for w in mats]
        tma_x = cpasync.make_tiled_tma_atom(op, xq, b_slot, (self.nx, BLOCK_K))
        tma_act = (cpasync.make_tiled_tma_atom(op, out_q, b_slot, (self.nx, BLOCK_K))
                   if self.fused else tma_x)
        # the fused kind's activations: a buffer of a slot's inter / 128 x tiles a consumer
        # warpgroup, kept while its down units stay on one slot
        act_layout = ring.mma_and_layouts(
            self.nx, 1, self.groups * self.d_kg if self.fused else 1)[2]

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            act_bars: cute.struct.MemRange[cutlass.Int64, self.groups]  # the fused kind's
            act: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(act_layout)], 1024]
            wsc: cute.struct.MemRange[cutlass.Float32,
                                      DOWN_SCALE_BATCH * self.d_kg * self.groups]
            xs: cute.struct.MemRange[cutlass.Float32, MAX_ROWS * self.d_kg * self.groups]
            sa: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(a_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(b_layout)], 1024]
            last: cute.struct.MemRange[cutlass.Int32, self.groups]
            amax: cute.struct.MemRange[cutlass.Float32, self.groups * 4 * MAX_ROWS]
            expert: cute.struct.MemRange[cutlass.Int32, self.max_slots]
            weight: cute.struct.MemRange[cutlass.Float32, self.table]
            rank: cute.struct.MemRange[cutlass.Int32, self.table]
            scales: cute.struct.MemRange[
                cutlass.Float32, (self.a_tiles + MAX_ROWS) * self.scale_groups * self.groups]

        self.storage = Storage
        self.kernel(tma[0][0], tma[0][1], tma[1][0], tma[1][1], tma[2][0], tma[2][1],
                    tma[3][0], tma[3][1], tma_x[0], tma_x[1], tiled_mma, a_layout, b_layout,
                    act_layout, sa, sb, sh_sa, sh_sb, sx, slot_expert, num_slots, parts,
                    arrivals, out_q, out_s, slot_weight, slot_rank, terms, tma[4][0],
                    tma[4][1], tma[5][0], tma[5][1], tma_act[0], tma_act[1], sd, sh_sd,
                    flags).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], smem=Storage.size_in_bytes(),
            stream=stream, use_pdl=self.pdl)

    @cute.jit
    def _split(self, pairs, grid):
        """gate/up's K chunks for `pairs` (slot, tile) pairs (gate_up_split on the device)."""
        split = cutlass.Int32(1)
        if cutlass.const_expr(self.gate_up):
            for s in cutlass.range_constexpr(2, self.kg + 1):
                if cutlass.const_expr(self.kg % s == 0):
                    if pairs * s <= grid * self.groups:
                        split = cutlass.Int32(s)
        return split


    @cute.jit
    def _load(self, tmas, t_g, t_s, t_gx, t_sx, slot, tile, group, expert, index, bar):
        """One ring slot's TMAs: the unit's weight tile(s) of its expert (shared: its own
        matrices) and x's tile (gate/up: the step's x; down: the slot's activations)."""
        for j in cutlass.range_constexpr(self.a_tiles):
            if expert == self.experts:
                cute.copy(tmas[2 + j], t_g[2 + j][(None, tile, group)],
                          t_s[2 + j][(None, self.a_tiles * index + j)], tma_bar_ptr=bar)
            else:
                cute.copy(tmas[j], t_g[j][(None, tile, group, expert)],
                          t_s[j][(None, self.a_tiles * index + j)], tma_bar_ptr=bar)
        x_tile = 0 if cutlass.const_expr(self.gate_up) else slot
        cute.copy(tmas[4], t_gx[(None, x_tile, group)], t_sx[(None, index)], tma_bar_ptr=bar)

    @cute.jit
    def _w_scale(self, ms: cute.Tensor, msh: cute.Tensor, expert, tile, group):
        """The weight scale of a unit's 64 rows in a 128-column group."""
        scale = cutlass.Float32(0.0)
        if expert == self.experts:
            scale = msh[tile * BLOCK_M // 128, group]
        else:
            scale = ms[expert, tile * BLOCK_M // 128, group]
        return scale

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mWa: cute.Tensor, tma_b: cute.CopyAtom,
               mWb: cute.Tensor, tma_sha: cute.CopyAtom, mShWa: cute.Tensor,
               tma_shb: cute.CopyAtom, mShWb: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
               tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               b_layout: cute.ComposedLayout, act_layout: cute.ComposedLayout,
               mSa: cute.Tensor, mSb: cute.Tensor,
               mShSa: cute.Tensor, mShSb: cute.Tensor, mSx: cute.Tensor,
               mSlotExpert: cute.Tensor, mNumSlots: cute.Tensor, mParts: cute.Tensor,
               mArrivals: cute.Tensor, mOutQ: cute.Tensor, mOutS: cute.Tensor,
               mSlotWeight: cute.Tensor, mSlotRank: cute.Tensor, mTerms: cute.Tensor,
               tma_d: cute.CopyAtom, mWd: cute.Tensor, tma_shd: cute.CopyAtom,
               mShWd: cute.Tensor, tma_act: cute.CopyAtom, mAct: cute.Tensor,
               mSd: cute.Tensor, mShSd: cute.Tensor, mFlags: cute.Tensor):
        stages, groups = self.stages, self.groups
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tmas = (tma_a, tma_b, tma_sha, tma_shb, tma_x, tma_d, tma_shd, tma_act)
        if warp == 0:
            for t in cutlass.range_constexpr(8 if self.fused else 5):
                cpasync.prefetch_descriptor(tmas[t])

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        s_a = storage.sa.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        s_b = storage.sb.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        pipe = ring.make_pipe(storage.bars.data_ptr(), stages, self.slot_bytes)

        s_a2 = cute.group_modes(s_a, 0, 2)
        s_b2 = cute.group_modes(s_b, 0, 2)
        t_s, t_g = [], []
        for t, w in ((tma_a, mWa), (tma_b, mWb), (tma_sha, mShWa), (tma_shb, mShWb),
                     (tma_d, mWd), (tma_shd, mShWd)):
            ts, tg = cpasync.tma_partition(
                t, 0, cute.make_layout(1), s_a2,
                cute.group_modes(cute.local_tile(w, (BLOCK_M, BLOCK_K), (None,) * cute.rank(w)),
                                 0, 2))
            t_s.append(ts)
            t_g.append(tg)
        t_sx, t_gx = cpasync.tma_partition(
            tma_x, 0, cute.make_layout(1), s_b2,
            cute.group_modes(cute.local_tile(mX, (self.nx, BLOCK_K), (None, None)), 0, 2))
        s_act = storage.act.get_tensor(act_layout.outer, swizzle=act_layout.inner)
        t_sact, t_gact = cpasync.tma_partition(
            tma_act, 0, cute.make_layout(1), cute.group_modes(s_act, 0, 2),
            cute.group_modes(cute.local_tile(mAct, (self.nx, BLOCK_K), (None, None)), 0, 2))

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()  # the slot table, x: the previous kernels' outputs
        n_slots = mNumSlots[0]
        # the step's slot table in shared memory (read by every unit)
        s_expert = storage.expert.get_tensor(cute.make_layout(self.max_slots))
        for i in cutlass.range(tidx, n_slots, self.threads, unroll=1):
            s_expert[i] = mSlotExpert[i]
        s_weight = storage.weight.get_tensor(cute.make_layout((self.m, self.max_slots)))
        s_rank = storage.rank.get_tensor(cute.make_layout((self.m, self.max_slots)))
        if cutlass.const_expr(not self.gate_up or self.fused):
            for i in cutlass.range(tidx, n_slots * self.m, self.threads, unroll=1):
                s_weight[i % self.m, i // self.m] = mSlotWeight[i // self.m, i % self.m]
                s_rank[i % self.m, i // self.m] = mSlotRank[i // self.m, i % self.m]
        act_bars = storage.act_bars.data_ptr()
        if cutlass.const_expr(self.fused):
            if warp == 0:
                with cute.arch.elect_one():
                    for i in cutlass.range_constexpr(groups):
                        cute.arch.mbarrier_init(act_bars + i, 1)
                cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        pairs = n_slots * self.tiles
        split = self._split(pairs, grid)
        chunk = self.kg // split
        units = pairs * split
        first = bidx * units // grid
        my_units = (bidx + 1) * units // grid - first
        rounds = (my_units + groups - 1) // groups
        # the fused kind's down units, after the CTA's gate/up units
        d_total = n_slots * self.d_units
        first_d = bidx * d_total // grid
        my_d = (bidx + 1) * d_total // grid - first_d

        if warp == 0:
            for f in cutlass.range(my_units * chunk, unroll=1):
                k, g_in, c, own = ring.round_slot(f, groups, chunk, my_units)
                unit = first + k  # a block of units a CTA: consecutive ones share an expert
                put = ring.ring_state(stages, self.per, c, own, True)
                pair = unit // split
                slot = pair // self.tiles
                expert = s_expert[slot]
                pipe.producer_acquire(put)
                self._load(tmas, t_g, t_s, t_gx, t_sx, slot, pair % self.tiles,
                           (unit % split) * chunk + g_in, expert, put.index,
                           pipe.producer_get_barrier(put))
            if cutlass.const_expr(self.fused):
                # down's weight tiles; their activations come by the consumer's own TMA, on a
                # barrier of its own, once gate/up has made them
                for f in cutlass.range(my_d * self.d_kg, unroll=1):
                    k, g_in, c, own = ring.round_slot(f, groups, self.d_kg, my_d)
                    own = own + ring.owned(c, groups, my_units) * chunk
                    unit = first_d + k
                    put = ring.ring_state(stages, self.per, c, own, True)
                    slot = unit // self.d_units
                    pipe.sync_object_empty.wait(put.index, put.phase)
                    pipe.sync_object_full.arrive_and_expect_tx(put.index, 2 * BLOCK_M * BLOCK_K)
                    self._load_down(tmas, t_g, t_s, unit % self.d_units, g_in, s_expert[slot],
                                    put.index, pipe.producer_get_barrier(put))
        elif wg >= 1:
            grp = wg - 1
            t = tidx % 128
            thr_mma = tiled_mma.get_slice(t)
            t_ra = tiled_mma.make_fragment_A(thr_mma.partition_A(s_a))
            t_rb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
            coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, self.nx)))
            acc = [cute.make_rmem_tensor(coords.shape, cutlass.Float32)
                   for _ in range(self.a_tiles)]
            part = [cute.make_rmem_tensor(coords.shape, cutlass.Float32)
                    for _ in range(self.a_tiles)]
            # a unit's scales [weight matrices, then x's rows; group in the chunk; warpgroup]
            sc = storage.scales.get_tensor(
                cute.make_layout((self.a_tiles + MAX_ROWS, self.scale_groups, groups)))
            for rnd in cutlass.range(rounds, unroll=1):
                in_round = cutlass.min(groups, my_units - rnd * groups)
                if grp < in_round:
                    unit = first + rnd * groups + grp
                    pair = unit // split
                    c = unit % split
                    slot = pair // self.tiles
                    tile = pair % self.tiles
                    expert = s_expert[slot]
                    self._stage_scales(sc, grp, t, expert, slot, tile, c * chunk, chunk, mSa,
                                       mShSa, mSb, mShSb, mSx)
                    self._mma_unit(tiled_mma, pipe, t_ra, t_rb, acc, part, coords, sc, grp,
                                   rnd * chunk, chunk)
                    if cutlass.const_expr(self.gate_up):
                        self._gate_up_out(acc, coords, slot, tile, c, split, grp, t, storage,
                                          mParts, mArrivals, mOutQ, mOutS, mFlags)
                    else:
                        self._down_out(acc[0], coords, slot, tile, s_weight, s_rank, mTerms)
            if cutlass.const_expr(self.fused):
                self._down_phase(tiled_mma, pipe, thr_mma, t_ra, s_act, acc, part, coords,
                                 storage, grp, t, ring.owned(grp, groups, my_units) * chunk,
                                 first_d, my_d, s_expert, s_weight, s_rank, tma_act, t_gact,
                                 t_sact, act_bars, mFlags, mSd, mShSd, mOutS, mTerms)
        if cutlass.const_expr(self.fused):
            self._finish(mFlags, n_slots, tidx, grid)

    @cute.jit
    def _mma_unit(self, tiled_mma: cute.TiledMma, pipe, t_ra: cute.Tensor, t_rb: cute.Tensor,
                  acc, part, coords: cute.Tensor, sc: cute.Tensor, grp, own0, chunk):
        """A unit's `chunk` ring slots (this warpgroup's own count from own0) into acc: each
        128-column group's wgmma product promoted with its weight and x scales."""
        for j in cutlass.range_constexpr(self.a_tiles):
            acc[j].fill(0.0)
        for s in cutlass.range(chunk, unroll=1):
            get = ring.ring_state(self.stages, self.per, grp, own0 + s, False)
            scale = [cute.make_rmem_tensor(coords.shape, cutlass.Float32)
                     for _ in range(self.a_tiles)]
            for e in cutlass.range_constexpr(cute.size(acc[0])):
                sxv = sc[self.a_tiles + cutlass.min(coords[e][1], self.m - 1), s, grp]
                for j in cutlass.range_constexpr(self.a_tiles):
                    scale[j][e] = sc[j, s, grp] * sxv
            pipe.consumer_wait(get)
            warpgroup.fence()
            for j in cutlass.range_constexpr(self.a_tiles):
                tiled_mma = ring.group_mma(tiled_mma, part[j], t_ra,
                                           self.a_tiles * get.index + j, t_rb, get.index)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe.consumer_release(get)
            for j in cutlass.range_constexpr(self.a_tiles):
                for e in cutlass.range_constexpr(cute.size(acc[0])):
                    acc[j][e] = acc[j][e] + part[j][e] * scale[j][e]

    @cute.jit
    def _down_phase(self, tiled_mma: cute.TiledMma, pipe, thr_mma, t_ra: cute.Tensor,
                    s_act: cute.Tensor, acc, part, coords: cute.Tensor, storage, grp, t,
                    own0, first_d, my_d, s_expert: cute.Tensor, s_weight: cute.Tensor,
                    s_rank: cute.Tensor, tma_act: cute.CopyAtom, t_gact: cute.Tensor,
                    t_sact: cute.Tensor, act_bars, mFlags: cute.Tensor, mSd: cute.Tensor,
                    mShSd: cute.Tensor, mOutS: cute.Tensor, mTerms: cute.Tensor):
        """The fused kind's down units of consumer warpgroup grp (its own ring count from
        own0): the ring brings the weight tiles; the slot's activations and their scales stay
        in the warpgroup's buffer while its units stay on one slot (a wait for the ready flags
        and one load per slot), and the units' weight scales are staged DOWN_SCALE_BATCH at
        a time, so a unit costs no load latency of its own."""
        groups, kg = self.groups, self.d_kg
        t_rb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_act))
        wsc = storage.wsc.get_tensor(cute.make_layout((DOWN_SCALE_BATCH, kg, groups)))
        xs = storage.xs.get_tensor(cute.make_layout((MAX_ROWS, kg, groups)))
        n_mine = ring.owned(grp, groups, my_d)
        cached = cutlass.Int32(-1)  # the slot whose activations the buffer holds
        loads = cutlass.Int32(0)  # of the buffer: its act barrier's phase
        for i in cutlass.range(n_mine, unroll=1):
            unit = first_d + i * groups + grp
            slot = unit // self.d_units
            u = unit % self.d_units
            if i % DOWN_SCALE_BATCH == 0:
                self._stage_down_scales(wsc, grp, t, i, n_mine, first_d, s_expert, mSd, mShSd)
            if slot != cached:
                self._wait_ready(mFlags, slot, grp, t)
                if t < 32:
                    cute.arch.fence_proxy("async.global")  # the TMA reads them next
                    bar = act_bars + grp
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(bar, kg * self.nx * BLOCK_K)
                    for g in cutlass.range_constexpr(kg):
                        cute.copy(tma_act, t_gact[(None, slot, g)],
                                  t_sact[(None, grp * kg + g)], tma_bar_ptr=bar)
                for r in cutlass.range(t, self.m * kg, 128, unroll=1):
                    xs[r // kg, r % kg, grp] = mOutS[slot * self.m + r // kg, r % kg]
                cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                cute.arch.mbarrier_wait(act_bars + grp, loads % 2)
                loads = loads + 1
                cached = slot
            for j in cutlass.range_constexpr(2):
                acc[j].fill(0.0)
            for s in cutlass.range(kg, unroll=1):
                get = ring.ring_state(self.stages, self.per, grp, own0 + i * kg + s, False)
                scale = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
                for e in cutlass.range_constexpr(cute.size(acc[0])):
                    scale[e] = wsc[i % DOWN_SCALE_BATCH, s, grp] * \
                        xs[cutlass.min(coords[e][1], self.m - 1), s, grp]
                pipe.consumer_wait(get)
                warpgroup.fence()
                for j in cutlass.range_constexpr(2):
                    tiled_mma = ring.group_mma(tiled_mma, part[j], t_ra, 2 * get.index + j,
                                               t_rb, grp * kg + s)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe.consumer_release(get)
                for j in cutlass.range_constexpr(2):
                    for e in cutlass.range_constexpr(cute.size(acc[0])):
                        acc[j][e] = acc[j][e] + part[j][e] * scale[e]
            for j in cutlass.range_constexpr(2):
                self._down_out(acc[j], coords, slot, 2 * u + j, s_weight, s_rank, mTerms)

    @cute.jit
    def _load_down(self, tmas, t_g, t_s, u, group, expert, index, bar):
        """A fused down unit's ring slot: its two 64-row tiles of the expert's down matrix
        (hidden rows 128 u ...) in a 128-column group."""
        for j in cutlass.range_constexpr(2):
            if expert == self.experts:
                cute.copy(tmas[6], t_g[5][(None, 2 * u + j, group)],
                          t_s[5][(None, 2 * index + j)], tma_bar_ptr=bar)
            else:
                cute.copy(tmas[5], t_g[4][(None, 2 * u + j, group, expert)],
                          t_s[4][(None, 2 * index + j)], tma_bar_ptr=bar)

    @cute.jit
    def _wait_ready(self, mFlags: cute.Tensor, slot, grp, t):
        """Wait (one thread polls, acquire; then the warpgroup's barrier) until gate/up has
        written every activation group of the slot. Past WAIT_SPINS polls it raises the
        error word and goes on: garbage out rather than a hang."""
        if t == 0:
            for g in cutlass.range(self.d_kg, unroll=1):
                ptr = mFlags.iterator + slot * self.d_kg + g
                seen = cute.arch.atomic_add(ptr, cutlass.Int32(0), sem="acquire", scope="gpu")
                spins = cutlass.Int32(0)
                while seen == 0:
                    seen = cute.arch.atomic_add(ptr, cutlass.Int32(0), sem="acquire",
                                                scope="gpu")
                    spins = spins + 1
                    if spins >= WAIT_SPINS:
                        seen = cutlass.Int32(-1)
                if seen < 0:
                    mFlags[cute.size(mFlags) - 1] = cutlass.Int32(1)
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _stage_down_scales(self, wsc: cute.Tensor, grp, t, i0, n_mine, first_d,
                           s_expert: cute.Tensor, mSd: cute.Tensor, mShSd: cute.Tensor):
        """The down scales of the warpgroup's units i0 .. i0 + DOWN_SCALE_BATCH - 1 (each
        unit's 128 rows, every group) into shared memory, their loads in flight together."""
        kg = self.d_kg
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)  # the last batch's reads
        for r in cutlass.range(t, DOWN_SCALE_BATCH * kg, 128, unroll=1):
            i = i0 + r // kg
            if i < n_mine:
                unit = first_d + i * self.groups + grp
                expert = s_expert[unit // self.d_units]
                u = unit % self.d_units
                v = cutlass.Float32(0.0)
                if expert == self.experts:
                    v = mShSd[u, r % kg]
                else:
                    v = mSd[expert, u, r % kg]
                wsc[r // kg, r % kg, grp] = v
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _finish(self, mFlags: cute.Tensor, n_slots, tidx, grid):
        """The fused kind's end: the last CTA to finish clears the ready flags and the count
        (every wait of this launch has passed), so the next launch finds them at zero."""
        cute.arch.barrier()
        if tidx == 0:
            done = mFlags.iterator + cute.size(mFlags) - 2
            old = cute.arch.atomic_add(done, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            if old == grid - 1:
                for i in cutlass.range(n_slots * self.d_kg, unroll=1):
                    mFlags[i] = cutlass.Int32(0)
                mFlags[cute.size(mFlags) - 2] = cutlass.Int32(0)

    @cute.jit
    def _stage_scales(self, sc: cute.Tensor, grp, t, expert, slot, tile, group0, chunk,
                      mSa: cute.Tensor, mShSa: cute.Tensor, mSb: cute.Tensor,
                      mShSb: cute.Tensor, mSx: cute.Tensor):
        """A unit's scales into shared memory, every load of the chunk in flight together
        (one latency a unit, not one a slot): its weight matrices' for the unit's rows, and
        x's (gate/up: the step's rows; down: the slot's activations') for each group."""
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)  # the last unit's read
        for i in cutlass.range(t, (self.a_tiles + self.m) * chunk, 128, unroll=1):
            what = i // chunk
            s = i % chunk
            v = cutlass.Float32(0.0)
            if what == 0:
                v = self._w_scale(mSa, mShSa, expert, tile, group0 + s)
            else:
                if cutlass.const_expr(self.gate_up):
                    if what == 1:
                        v = self._w_scale(mSb, mShSb, expert, tile, group0 + s)
                    else:
                        v = mSx[what - 2, group0 + s]
                else:
                    v = mSx[slot * self.m + what - 1, group0 + s]
            sc[what, s, grp] = v
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _down_out(self, acc: cute.Tensor, coords: cute.Tensor, slot, tile, s_weight: cute.Tensor,
                  s_rank: cute.Tensor, mTerms: cute.Tensor):
        """term = bf16(weight * y) at terms[row, rank] for the rows that chose the slot."""
        for e in cutlass.range_constexpr(cute.size(acc)):
            row = coords[e][1]
            if row < self.m:
                rank = s_rank[row, slot]
                if rank >= 0:
                    y = s_weight[row, slot] * acc[e]
                    mTerms[row * self.terms + rank, tile * BLOCK_M + coords[e][0]] = \
                        y.to(cutlass.BFloat16)

    @cute.jit
    def _gate_up_out(self, acc, coords: cute.Tensor, slot, tile, c, split, grp, t, storage,
                     mParts: cute.Tensor, mArrivals: cute.Tensor, mOutQ: cute.Tensor,
                     mOutS: cute.Tensor, mFlags: cute.Tensor):
        """Store the chunk's gate and up partials; the last of the (slot, 128 columns) group's
        units to arrive finishes the group: chunks summed in order, SwiGLU, per-row quant."""
        p = slot * split + c
        for e in cutlass.range_constexpr(cute.size(acc[0])):
            row = coords[e][1]
            col = tile * BLOCK_M + coords[e][0]
            if row < self.m:
                mParts[p, row, col] = acc[0][e]
                mParts[p, row, self.inter + col] = acc[1][e]
        last = storage.last.get_tensor(cute.make_layout(self.groups))
        q = tile // 2
        counter = slot * (self.inter // 128) + q
        ring.arrive(last, grp, t, mArrivals.iterator + counter, 2 * split)
        if last[grp] == 1:
            cute.arch.fence_acq_rel_gpu()
            amax = storage.amax.get_tensor(cute.make_layout((MAX_ROWS, 4, self.groups)))
            act = cute.make_rmem_tensor((MAX_ROWS,), cutlass.Float32)
            gs = cute.make_rmem_tensor((MAX_ROWS,), cutlass.Float32)
            us = cute.make_rmem_tensor((MAX_ROWS,), cutlass.Float32)
            col = q * 128 + t
            lane, w = t % 32, t // 32
            for row in cutlass.range_constexpr(self.m):
                gs[row] = mParts[slot * split, row, col]
                us[row] = mParts[slot * split, row, self.inter + col]
            # chunks in order, each row's loads of a chunk in flight together
            for cc in cutlass.range(1, split, unroll=4):
                for row in cutlass.range_constexpr(self.m):
                    gs[row] = gs[row] + mParts[slot * split + cc, row, col]
                    us[row] = us[row] + mParts[slot * split + cc, row, self.inter + col]
            for row in cutlass.range_constexpr(self.m):
                g = gs[row].to(cutlass.BFloat16).to(cutlass.Float32)
                u = us[row].to(cutlass.BFloat16).to(cutlass.Float32)
                a = (g / (1.0 + cute.math.exp(-g, fastmath=True)) * u).to(cutlass.BFloat16).to(cutlass.Float32)
                act[row] = a
                v = cute.arch.fmax(a, -a)
                for off in cutlass.range_constexpr(5):
                    v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=16 >> off))
                if lane == 0:
                    amax[row, w, grp] = v
            cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
            for row in cutlass.range_constexpr(self.m):
                v = cute.arch.fmax(cute.arch.fmax(amax[row, 0, grp], amax[row, 1, grp]),
                                   cute.arch.fmax(amax[row, 2, grp], amax[row, 3, grp]))
                s = cute.arch.fmax(v, 1e-10) / 448.0
                qv = act[row] * (1.0 / s)
                qv = cute.arch.fmax(cute.arch.fmin(qv, 448.0), -448.0)
                mOutQ[slot * self.nx + row, col] = qv.to(cutlass.Float8E4M3FN)
                if t == 0:
                    mOutS[slot * self.m + row, q] = s
            if t == 0:
                mArrivals[counter] = cutlass.Int32(0)
            if cutlass.const_expr(self.fused):  # the slot's group is ready for down (release)
                cute.arch.fence_acq_rel_gpu()
                cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                if t == 0:
                    cute.arch.atomic_add(mFlags.iterator + counter, cutlass.Int32(1),
                                         sem="release", scope="gpu")


@functools.lru_cache(maxsize=None)
def _compiled(kind: str, m: int, inter: int, hidden: int, experts: int, max_slots: int,
              terms: int, stages: int, groups: int, pdl: bool):
    """The compiled form; every tensor's shape and stride stays dynamic (slot counts, expert
    strides and buffer sizes vary), only ranks, dtypes and unit strides are fixed."""
    import cuda.bindings.driver as cuda

    mma = Fp8ExpertsMma(kind, m, inter, hidden, experts, max_slots, terms, stages, groups, pdl)
    fn = cute.compile(mma, *(_tensor(t) for t in _shapes(mma)), 1, cuda.CUstream(0))
    return mma, fn


def _shapes(mma: Fp8ExpertsMma):
    """Small CPU tensors of each argument's rank and dtype (for compiling)."""
    import torch

    e4m3, f32, i32 = torch.float8_e4m3fn, torch.float32, torch.int32
    w = torch.empty(2, 128, 256, dtype=e4m3).permute(1, 2, 0)
    s = torch.empty(2, 2, 2, dtype=f32)
    sh_w, sh_s = torch.empty(128, 256, dtype=e4m3), torch.empty(2, 2, dtype=f32)
    x, sx = torch.empty(32, 256, dtype=e4m3), torch.empty(4, 2, dtype=f32)
    return (w, s, w, s, sh_w, sh_s, sh_w, sh_s, x, sx, torch.empty(4, dtype=i32),
            torch.empty(2, dtype=i32), torch.empty(2, 4, 256, dtype=f32),
            torch.empty(4, dtype=i32), torch.empty(32, 256, dtype=e4m3),
            torch.empty(4, 2, dtype=f32), torch.empty(4, 2, dtype=f32),
            torch.empty(4, 2, dtype=i32), torch.empty(8, 256, dtype=torch.bfloat16),
            w, s, sh_w, sh_s, torch.empty(4, dtype=i32))


def _tensor(t):
    """t as a CuTe tensor with dynamic shape and strides (its unit-stride mode kept); e4m3
    tensors (the TMA's) 16-byte aligned, the others (scale and table views at any offset)
    only to their element."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    ct = from_dlpack(t, assumed_align=16 if t.dtype == torch.float8_e4m3fn else t.element_size())
    unit = [d for d in range(t.dim()) if t.stride(d) == 1]
    return ct.mark_layout_dynamic(leading_dim=unit[-1])


@functools.lru_cache(maxsize=None)
def _unused(device, kind: str):
    """Device tensors for the arguments a kind never reads (made once, outside any capture)."""
    return tuple(t.to(device) for t in _shapes(Fp8ExpertsMma(kind, 1, 128, 128, 1)))


def _check(name: str, t, shape: tuple, dtype, contiguous: bool = True) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or (contiguous and
                                                            not t.is_contiguous()):
        raise ValueError(f"fp8_moe: {name} must be a{' contiguous' if contiguous else ''} "
                         f"{dtype} {tuple(shape)}, got {t.dtype} {tuple(t.shape)}")


def _check_stack(name: str, q, s, rows: int, k: int, experts=None) -> None:
    """A routed stack [E, rows, K] (each expert's rows contiguous) or the shared [rows, K],
    with its scales [(E,) rows / 128, K / 128]."""
    import torch

    lead = () if experts is None else (experts,)
    _check(name, q, lead + (rows, k), torch.float8_e4m3fn, False)
    if q.stride(-1) != 1 or q.stride(-2) != k:
        raise ValueError(f"fp8_moe: {name} must be e4m3 with each expert's rows contiguous")
    _check(name + " scales", s, lead + (rows // 128, k // 128), torch.float32, False)


def _launch(kind, m, inter, hidden, experts, max_slots, terms, args, stages, grid, groups, pdl,
            device):
    import cuda.bindings.driver as cuda
    import torch

    grid = grid or torch.cuda.get_device_properties(device).multi_processor_count
    _, fn = _compiled(kind, m, inter, hidden, experts, max_slots, terms, stages, groups, pdl)
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    fn(*(_tensor(t) for t in args), grid, stream)


def _gate_up_checked(xq, sx, gate_q, gate_s, up_q, up_s, sh_gate_q, sh_gate_s, sh_up_q,
                     sh_up_s, slot_expert, num_slots, parts, arrivals, act_q, act_s,
                     units: int):
    """Refuse gate/up's arguments unless as ``gate_up`` documents them (`units`: the launch's
    consumer warpgroups, which size parts); xq's first x_rows(M) rows, which the MMA reads."""
    import torch

    m, kg = sx.shape
    hidden = kg * 128
    e, inter = gate_q.shape[0], gate_q.shape[1]
    nx = x_rows(m)
    slots = slot_expert.shape[0]
    if xq.shape[0] < nx:
        raise ValueError(f"fp8_moe: xq needs at least {nx} rows for {m}, got {xq.shape[0]}")
    xq = xq[:nx]
    _check("xq", xq, (nx, hidden), torch.float8_e4m3fn)
    _check("sx", sx, (m, kg), torch.float32)
    for name, q, s, ex in (("gate", gate_q, gate_s, e), ("up", up_q, up_s, e),
                           ("shared gate", sh_gate_q, sh_gate_s, None),
                           ("shared up", sh_up_q, sh_up_s, None)):
        _check_stack(name, q, s, inter, hidden, ex)
    if gate_q.stride() != up_q.stride():
        raise ValueError("fp8_moe: gate and up stacks must have the same strides")
    _check("slot_expert", slot_expert, (slots,), torch.int32)
    _check("num_slots", num_slots, (1,), torch.int32)
    if parts.dim() != 3 or parts.shape[1:] != (m, 2 * inter):
        raise ValueError(f"fp8_moe: parts must be fp32 [P, {m}, {2 * inter}], got "
                         f"{tuple(parts.shape)}")
    _check("parts", parts, tuple(parts.shape), torch.float32)
    _check("arrivals", arrivals, (slots * (inter // 128),), torch.int32)
    _check("act_q", act_q, (slots * nx, inter), torch.float8_e4m3fn)
    _check("act_s", act_s, (slots * m, inter // 128), torch.float32)
    need = gate_up_parts_rows(slots, inter, hidden, units)
    if parts.shape[0] < need:
        raise ValueError(f"fp8_moe: parts needs {need} (slot, chunk) rows for {slots} slots, "
                         f"got {parts.shape[0]}")
    return xq


def _down_checked(act_q, act_s, down_q, down_s, sh_down_q, sh_down_s, slot_expert, num_slots,
                  slot_weight, slot_rank, terms) -> None:
    """Refuse down's arguments unless as ``down`` documents them."""
    import torch

    slots, m = slot_weight.shape
    e, hidden, inter = down_q.shape
    _check("act_q", act_q, (slots * x_rows(m), inter), torch.float8_e4m3fn)
    _check("act_s", act_s, (slots * m, inter // 128), torch.float32)
    _check_stack("down", down_q, down_s, hidden, inter, e)
    _check_stack("shared down", sh_down_q, sh_down_s, hidden, inter)
    _check("slot_expert", slot_expert, (slots,), torch.int32)
    _check("num_slots", num_slots, (1,), torch.int32)
    _check("slot_weight", slot_weight, (slots, m), torch.float32)
    _check("slot_rank", slot_rank, (slots, m), torch.int32)
    if terms.dim() != 3 or terms.shape[0] != m or terms.shape[2] != hidden:
        raise ValueError(f"fp8_moe: terms must be bf16 [{m}, TERMS, {hidden}], got "
                         f"{tuple(terms.shape)}")
    _check("terms", terms, tuple(terms.shape), torch.bfloat16)


def _units(device, grid: int, groups: int) -> int:
    """Consumer warpgroups of a launch of `grid` CTAs (0: one a multiprocessor)."""
    import torch

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return (grid or sms) * (groups or GROUPS)


def gate_up(xq, sx, gate_q, gate_s, up_q, up_s, sh_gate_q, sh_gate_s, sh_up_q, sh_up_s,
            slot_expert, num_slots, parts, arrivals, act_q, act_s, stages: int = 0,
            grid: int = 0, groups: int = 0, pdl: bool = False) -> None:
    """act = quant(SwiGLU(x G_e^T, x U_e^T)) of every slot's expert (module docstring).
    xq e4m3 [R >= x_rows(M), H], sx fp32 [M, H/128]; gate_q / up_q e4m3 [E, I, H] (any expert
    stride), scales fp32 [E, I/128, H/128]; the shared expert's [I, H], [I/128, H/128];
    slot_expert int32 [S] (slot 0 the shared expert, id E), num_slots int32 [1] (<= S);
    parts fp32 [P >= gate_up_parts_rows(S, I, H, units), M, 2I] (scratch); arrivals int32
    [S * I/128] at zero (left at zero); act_q e4m3 [S * x_rows(M), I] (rows past M of each
    slot untouched), act_s fp32 [S * M, I/128]."""
    xq = _gate_up_checked(xq, sx, gate_q, gate_s, up_q, up_s, sh_gate_q, sh_gate_s, sh_up_q,
                          sh_up_s, slot_expert, num_slots, parts, arrivals, act_q, act_s,
                          _units(parts.device, grid, groups))
    m, hidden = sx.shape[0], sx.shape[1] * 128
    e, inter = gate_q.shape[0], gate_q.shape[1]
    unused = _unused(parts.device, GATE_UP)
    args = (gate_q.permute(1, 2, 0), gate_s, up_q.permute(1, 2, 0), up_s, sh_gate_q, sh_gate_s,
            sh_up_q, sh_up_s, xq, sx, slot_expert, num_slots, parts, arrivals, act_q, act_s,
            *unused[16:])
    _launch(GATE_UP, m, inter, hidden, e, slot_expert.shape[0], 1, args, stages, grid, groups,
            pdl, parts.device)


def down(act_q, act_s, down_q, down_s, sh_down_q, sh_down_s, slot_expert, num_slots,
         slot_weight, slot_rank, terms, stages: int = 0, grid: int = 0, groups: int = 0,
         pdl: bool = False) -> None:
    """terms[row, rank] = bf16(weight[slot, row] * act_slot D_e^T[row]) for each slot's rows
    that chose its expert (module docstring). act_q e4m3 [S * x_rows(M), I], act_s fp32
    [S * M, I/128] (gate_up's); down_q e4m3 [E, H, I] (any expert stride), down_s fp32
    [E, H/128, I/128]; the shared expert's [H, I], [H/128, I/128]; slot_weight fp32 and
    slot_rank int32 [S, M] (route's); terms bf16 [M, TERMS, H]."""
    _down_checked(act_q, act_s, down_q, down_s, sh_down_q, sh_down_s, slot_expert, num_slots,
                  slot_weight, slot_rank, terms)
    slots, m = slot_weight.shape
    e, hidden, inter = down_q.shape
    unused = _unused(terms.device, DOWN)
    args = (down_q.permute(1, 2, 0), down_s, down_q.permute(1, 2, 0), down_s, sh_down_q,
            sh_down_s, sh_down_q, sh_down_s, act_q, act_s, slot_expert, num_slots, unused[12],
            unused[13], unused[14], unused[15], slot_weight, slot_rank,
            terms.view(m * terms.shape[1], hidden), *unused[19:])
    _launch(DOWN, m, inter, hidden, e, slots, terms.shape[1], args, stages, grid, groups, pdl,
            terms.device)


def experts(xq, sx, gate_q, gate_s, up_q, up_s, down_q, down_s, sh_gate_q, sh_gate_s, sh_up_q,
            sh_up_s, sh_down_q, sh_down_s, slot_expert, num_slots, slot_weight, slot_rank,
            parts, arrivals, flags, act_q, act_s, terms, stages: int = 0, grid: int = 0,
            groups: int = 0, pdl: bool = False) -> None:
    """``gate_up`` then ``down`` in one launch (the module docstring's ``experts``): the same
    arguments and outputs (act_q / act_s are written on the way, as gate_up's), and flags
    int32 [flags_size(S, I)] at zero (left at zero; its last word is the error word: 1 if a
    wait gave up, see ``check_flags``). The grid may not exceed the multiprocessors: the CTAs
    wait on each other, so every one must be resident."""
    import torch

    sms = torch.cuda.get_device_properties(parts.device).multi_processor_count
    if grid > sms:
        raise ValueError(f"fp8_moe.experts: grid {grid} exceeds the {sms} multiprocessors "
                         "(its CTAs wait on each other: all must be resident)")
    xq = _gate_up_checked(xq, sx, gate_q, gate_s, up_q, up_s, sh_gate_q, sh_gate_s, sh_up_q,
                          sh_up_s, slot_expert, num_slots, parts, arrivals, act_q, act_s,
                          _units(parts.device, grid, groups))
    _down_checked(act_q, act_s, down_q, down_s, sh_down_q, sh_down_s, slot_expert, num_slots,
                  slot_weight, slot_rank, terms)
    m, hidden = sx.shape[0], sx.shape[1] * 128
    e, inter = gate_q.shape[0], gate_q.shape[1]
    slots = slot_expert.shape[0]
    _check("flags", flags, (flags_size(slots, inter),), torch.int32)
    args = (gate_q.permute(1, 2, 0), gate_s, up_q.permute(1, 2, 0), up_s, sh_gate_q, sh_gate_s,
            sh_up_q, sh_up_s, xq, sx, slot_expert, num_slots, parts, arrivals, act_q, act_s,
            slot_weight, slot_rank, terms.view(m * terms.shape[1], hidden),
            down_q.permute(1, 2, 0), down_s, sh_down_q, sh_down_s, flags)
    _launch(EXPERTS, m, inter, hidden, e, slots, terms.shape[1], args, stages, grid, groups,
            pdl, parts.device)


def flags_problems(flags) -> list:
    """What ``experts``' flags say between launches (syncs with the host): a completed launch
    leaves every word at zero, so a nonzero word is its error word (a wait gave up: that
    launch's outputs are garbage) or a flag it did not clear. Works on the one buffer a
    caller's views of several slot counts share: each view's last word is its error word."""
    bad = flags.nonzero().flatten().tolist()
    if not bad:
        return []
    return [f"fp8_moe.experts: flags not at zero after a launch (words {bad[:8]}"
            f"{' ...' if len(bad) > 8 else ''} of {flags.numel()}): a wait for gate/up's "
            "activations gave up, so that launch's outputs are garbage, or a flag was not "
            "cleared"]


def check_flags(flags) -> None:
    """Raise ``flags_problems``' finding, if any."""
    problems = flags_problems(flags)
    if problems:
        raise RuntimeError(problems[0])
