"""The attention side of a decode layer as one persistent launch (CuTe DSL, sm_90), built stage
by stage (DESIGN's kernel plan, step 2). Built so far: q_a|kv_a, then q_b on c_q normed and
quantized inside q_b's own units, for 1-16 rows, in one launch where the stage kernels take
three (fp8_linear, latent, q_b).

    kv_parts fp32 [S1, M, NKV]  = the K chunks of xq W_kv^T (the latent step's input)
    q_rows   bf16 [M, NQ]       = c_q = xq W_q^T, summed over its chunks in order
    qb_parts fp32 [S2, M, NB]   = the K chunks of quant(rms_norm(c_q) * gamma) W_qb^T

with xq e4m3 [>= 8 or 16, K1] and its scales sx [M, K1/128] (the layer's first norm,
quantized), FP8 block-128 weights, and the reference's numerics: fp32 block dequantization
(fp8_mma's), c_q rounded to bf16, its norm in fp32 rounded to bf16, then e4m3 with one
scale per 128 columns (max(amax, 1e-10) / 448).

Structure: one CTA per SM (every CTA resident: the waits below assume it), a producer warp and
a consumer warpgroup a worker, each worker with its own part of the shared-memory ring (ring.py
says why). Units are numbered stage by stage, (64-row tile, K chunk) each; worker w takes
units w, w + W, ... (W workers), so every worker finishes its q_a|kv_a units before its q_b
units. Launched programmatically dependent, the producers issue their first lap of q_a|kv_a
weight tiles before waiting for the previous kernel, x's tiles after; q_b's weight tiles
only once the worker's q_a|kv_a tiles have landed (``late_q_b``: HBM then serves q_a|kv_a's
16 MB alone, and q_b's 4 MB arrive during c_q's reduction and norm).
- q_a|kv_a units (fp8_mma's consumer): W tiles and x tiles by TMA, the scratch product scaled
  into fp32, stored as the unit's K chunk. A c_q tile's last chunk to arrive (one atomic a
  unit) sums the chunks into bf16 rows and each row's sum of squares over its 64 columns, then
  sets the tile's flag to the launch's epoch.
- q_b units: wait for the c_q tiles' flags, then make their own B operand: each row's rms from
  the tiles' sums of squares, the unit's 128-column groups normed, scaled by gamma, quantized
  and written into shared memory in wgmma's swizzled layout (with their scales); then the MMAs
  on the ring's weight tiles.
The fixed form (``fixed``, 1-2 rows): no tails. Each q_a|kv_a unit adds its chunk into int64
sums [M, NQ + NKV] in 2^-32 units (relaxed atomics with no returned value; integer adds in any
order give the same bits) and counts itself into its tile's count; q_b's units wait for the
c_q tiles' counts and make their operand from the sums (each thread a column of every 128 of
its rows: the rms from the whole row), and M tasks numbered after q_b's units (they fall to
workers with one unit) wait for kv_a's tiles and write each row's KV-cache row as the latent
kernel does (c_kv normed, k_pe roped, into the row's slot; nothing for a pad row), so the
launch does all that fp8_linear + latent + fp8_linear do; kv_parts are not written. Sums and
counts come in two sets by the epoch's parity: a launch adds into one and zeroes the other for
the next (its wait saw the previous launch, their last reader, finish).
Epochs: flags hold the launch's epoch (sync[0]); the last CTA to finish bumps it for the next
launch, so nothing is reset between launches (graph-capturable; arrival counters go back to
zero in their tail). A wait that outlasts SPIN_LIMIT polls sets sync[2] and gives up (wrong
output, no hang); ``check_sync`` turns it into an error where the caller can afford a read.

Measured on an H200 (``benchmark/attn_side_probe.py``, weights cycled through 13 copies so
none stays in L2; results/attn_side_probe_20261204T145411Z at acd07c0, the stage kernels in
the same run under the layer's overlap; floor 4.83 us for the 20.3 MB):

    rows               1      2      4      8     12     16
    attn_side      11.52  11.75  11.74  11.99  12.75  13.62 us  (42-35% of the floor)
    stage kernels  11.14  11.14  11.44  11.70  11.80  12.33 us  (fp8_linear, latent, q_b)

so the one launch is 3-10% slower than the three stage kernels it replaces (which also write
the KV-cache row). The fixed form, which writes it too, is faster at one row and level at two
(results/attn_side_probe_20261204T182239Z at 6eeb3fa, two passes, the stage kernels in the
same runs): 10.34 / 10.35 us against 11.09 / 11.16 at one row, 11.48 / 11.11 against 11.51 /
11.21 at two (the tail form 11.49-11.62). Its cold trace at one row: q_a|kv_a's MMAs done 5.4,
counted 5.9, the counts seen 6.9, q_b's x made 7.9, q_b done 8.5: ~3.1 us from the MMAs to
q_b's, against ~4.6 with the tails. At two rows its operand takes ~2 us (32 KB of sums a unit).

In the layer (``sm90.ATTN_SIDE``: the fixed form at 1..ATTN_SIDE_MAX_ROWS rows of a layer
without the indexer, a server's pool table through ``slot_rows``): a MoE layer -0.9 / -1.0 us
at two rows and level at one (results/tiling_probe_20261204T200536Z, T200609Z; a third run,
four pairs each, -0.3 at two rows and +0.0..+0.5 at one: T202555Z), once absorb
after it loads its w_kc tile before its wait instead of prefetching it into L2 (that cost
~3 us: T200329Z); the kernel before it adds ~1.7 us while these CTAs stream q_a|kv_a's 16 MB
before their wait (graph_timeline_20261204T200020Z against T200040Z).

Its prologue's loads needed a fence (``_make_x2_fixed``): without it each was sunk next to its
conversion and ~6 were in flight, 2.8 us at two rows (results/attn_side_probe_20261204T181410Z). Its trace (``--trace``: each worker's %globaltimer at its phases, one cold
launch; medians, us after the first worker's start, one row / 16 rows): q_a|kv_a's MMAs done
5.1 / 5.6 (its 16 MB at ~3.2 TB/s from the start), arrived 5.9 / 6.4, c_q's tails done
7.2 / 7.9 (max 7.4 / 8.2), the tails' flags seen 8.2 / 9.0, q_b's x made 9.0 / 11.0, q_b
done 9.5 / 11.5: after q_a|kv_a's stream, one split-K reduction, the norm and the next linear
cost ~4.4 us at one row (arrival 0.8, tail 1.3, flag 1.0, prologue 0.8, MMA 0.5) and ~6 at 16,
where the probe's skeleton charged a dependency 1.2-1.8 us. Each measured step, in the same
runs (T143538Z .. T145411Z): the tail's and the prologue's loads issued together rather than
row by row (the tail 3.3 -> 1.8 us at 16 rows), gamma and q_b's weight scales read before the
wait, the arrival without a fence a thread (-0.9 / -2.8 us a launch at 1 / 16 rows, c6a5195
against f329e10); q_b's weights after q_a|kv_a's (-0.6..-1.3 us: the ``_early_q_b`` arm,
T144145Z, T145411Z); the prologue with 128 / M lanes a row (its step 1.5 -> 1.0 us at one
row in the trace, the launch within noise: 477ba4b against 4ae4153); launched dependent
-0.8..-1.7 us (``_nopdl`` arm; its CTAs cannot sit beside the previous launch's:
123 registers x 384 threads and ~200 KB of shared memory a CTA). Tried and reverted (code
at f15e81a, T144940Z): c_q's rows and sums of squares as LL words (value and epoch in one
64-bit store) polled by the q_b units' own loads, no fence and no flag: correct, but 11.45
-> 18.0 us at one row and 27 at 8, every q_b unit's threads polling ~10 words each starving
the tails' stores. Nor did the c_q tiles' arrival counters and flags a 128-byte line each
(rather than 32 flags on one line that every q_b unit polls) change anything: -0.06..-0.08 us
(code at c409a09, T145855Z).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import ring
from .fp8_mma import MAX_ROWS, split_for, x_rows

BLOCK_M, BLOCK_K = ring.BLOCK_M, ring.BLOCK_K
SMEM_BYTES = 200 * 1024
GROUPS = 2  # workers (consumer warpgroups, producer warps) a CTA
FP8_MAX = 448.0
ACT_EPS = 1e-10
SPIN_LIMIT = 1 << 24  # polls before a wait gives up (seconds on an H200)
# the fixed form (``AttnSide.fixed``): c_q's K chunks added as integers in units of
# 2^-FIXED_BITS, at most FIXED_MAX_ROWS rows (each q_b unit reads its rows whole)
FIXED_BITS = 32
FIXED_MAX_ROWS = 2
ROPE = 64  # the rope columns at the end of kv_a's output (the rest is c_kv)
# sync words: 0 the epoch (starts at 1), 1 CTAs done, 2 a wait gave up; c_q tile t's flag
# at FLAGS + t
EPOCH, DONE, FAILED, FLAGS = 0, 1, 2, 8
# measurement only (trace=True): each worker's %globaltimer (ns) at these points of its last
# units, into trace int64 [TRACE_WORKERS, len(TRACE_POINTS)] (0: not reached)
TRACE_POINTS = ("start", "q_a|kv_a mma", "arrived", "c_q tail", "c_q seen", "x made",
                "q_b mma", "end")
TRACE_WORKERS = 1024


class Shape(NamedTuple):
    """One TP rank's q_a|kv_a then q_b: NQ = q_lora_rank, NKV = kv_lora_rank + rope dims,
    K1 = hidden, NB = the rank's heads x qk_head_dim."""
    nq: int = 2048
    nkv: int = 576
    k1: int = 6144
    nb: int = 2048


def _acts(mode: str, lap0, later, first, second, late_q_b: bool):
    """(load the weight tile, load the x tile) of a slot in the producer's `mode`: in its
    first lap (lap0) or after (later), of a q_a|kv_a unit (first) or a q_b unit (second).
    late_q_b: q_b's slots all wait for "rest" (after the worker's q_a|kv_a tiles landed)."""
    yes, no = cutlass.Boolean(True), cutlass.Boolean(False)
    if late_q_b:
        early, rest = first & lap0, later | second
    else:
        early, rest = lap0, later
    return {"all": (yes, yes), "w0": (early, no), "x0": (no, early), "rest": (rest, rest)}[mode]


class AttnSide:
    """One compiled form: m rows of `shape`, q_a|kv_a in split1 K chunks, q_b in split2."""

    def __init__(self, m: int, shape: Shape = Shape(), split1: int = 0, split2: int = 0,
                 eps: float = 1e-5, groups: int = GROUPS, pdl: bool = True,
                 first_only: bool = False, dump: bool = False, trace: bool = False,
                 late_q_b: bool = True, fixed: bool = False, by_rows: bool = False,
                 early_dependents: bool = True, early_slots=None, norm_in: bool = False):
        if not 1 <= m <= MAX_ROWS:
            raise ValueError(f"attn_side takes 1..{MAX_ROWS} rows, got {m}")
        if fixed and m > FIXED_MAX_ROWS:
            raise ValueError(f"attn_side: the fixed form takes 1..{FIXED_MAX_ROWS} rows (each q_b "
                             f"unit reads c_q's rows whole), got {m}")
        if norm_in and not fixed:
            raise ValueError("attn_side: norm_in (the layer's input norm folded in) is the fixed "
                             "form's: its c_q and KV-row consumers apply the row's rstd")
        if not 1 <= groups <= 4:
            raise ValueError("attn_side: 1-4 workers a CTA (one producer warp each)")
        nq, nkv, k1, nb = shape
        # NQ: whole 128-column groups, its half tiles' sums of squares in steps of 8
        if nq % 256 or k1 % BLOCK_K or nkv % BLOCK_M or nb % BLOCK_M:
            raise ValueError(f"attn_side: NQ must be a multiple of 256, K1 of {BLOCK_K}, NKV "
                             f"and NB of {BLOCK_M}; got {shape}")
        self.m, self.shape, self.eps, self.groups = m, shape, eps, groups
        self.nx = x_rows(m)
        self.tq, self.tkv = nq // BLOCK_M, nkv // BLOCK_M
        self.tiles1, self.tiles2 = self.tq + self.tkv, nb // BLOCK_M
        self.kg1, self.kg2 = k1 // BLOCK_K, nq // BLOCK_K
        self.split1 = split1 or split_for(nq + nkv, k1)
        self.split2 = split2 or split_for(nb, nq)
        for name, s, kg in (("split1", self.split1, self.kg1), ("split2", self.split2, self.kg2)):
            if kg % s:
                raise ValueError(f"attn_side: {name} must divide {kg}, got {s}")
        self.chunk1, self.chunk2 = self.kg1 // self.split1, self.kg2 // self.split2
        # the layer's input norm folded in (fixed form): each q_a|kv_a unit makes its own x
        # chunk from the un-normed row (hidden + residual, times the norm's weight, e4m3 per
        # 128 columns) in the worker's B buffer, as q_b's units do theirs; c_q's and the KV
        # row's consumers multiply by the row's rstd from the chunks' sums of squares that
        # tile 0's units write, with the new residual (``_make_x1``)
        self.norm_in = norm_in
        # 128-column groups of the worker's B buffer (and its scales): q_b's chunk, or with
        # norm_in also q_a|kv_a's
        self.xg = max(self.chunk1, self.chunk2) if norm_in else self.chunk2
        self.units1 = self.tiles1 * self.split1
        self.units = self.units1 + self.tiles2 * self.split2
        # launched programmatically dependent: the producers stream their first lap of weight
        # tiles before waiting for the previous kernel (its outputs, and its epoch bump)
        self.pdl = pdl
        # launched dependent: let the next kernel launch as this one starts (its programs then
        # sit beside these CTAs where they fit), or only as it ends
        self.early_dependents = early_dependents
        # measurement only: q_a|kv_a's units alone (c_q's tails still run)
        if first_only:
            self.units = self.units1
        # testing only: q_b's B operand, dequantized, into dump [M, NQ] (fp32)
        self.dump = dump
        self.trace = trace
        # q_b's weight tiles asked of HBM only after the worker's q_a|kv_a tiles landed (they
        # have c_q's reduction and norm to arrive in), so q_a|kv_a's stream alone
        self.late_q_b = late_q_b
        # c_q reduced without tails: each q_a unit adds its chunk into int64 sums (2^-FIXED_BITS
        # units: integer adds, so the order of arrival cannot change a bit) and counts itself
        # in; q_b's units wait for the counts and norm from the sums (module docstring)
        self.fixed = fixed
        # the fixed form also writes each row's KV-cache row (c_kv normed, k_pe roped): M tasks
        # numbered after q_b's units (so they fall to workers that took one unit)
        self.kv_c = nkv - ROPE
        self.kv_tasks = m if fixed else 0
        # the fixed form's slot table is a pool's ([R, W]: upstream's req_to_token read in
        # place), row m's being rows[m], rather than one table row a step row
        self.by_rows = by_rows
        if fixed and (self.kv_c <= 0 or self.kv_c % 128 or ROPE // 2 > 128):
            raise ValueError(f"attn_side: the fixed form needs NKV - {ROPE} a positive multiple "
                             f"of 128, got NKV {nkv}")
        self.slot_bytes = (BLOCK_M + self.nx) * BLOCK_K
        # q_b's prologue: `lanes` threads a row (M rounded up to a power of two, >= 4), each
        # norming `cols` columns of each group
        rows_pad = max(4, 1 << (m - 1).bit_length())
        self.lanes, self.cols = 128 // rows_pad, rows_pad
        if fixed:  # every thread of the warpgroup on each row, a column of each group
            self.lanes, self.cols = 128, 1
        self.lane_bits = self.lanes.bit_length() - 1
        xbuf = groups * self.xg * self.nx * BLOCK_K
        self.per = (SMEM_BYTES - 4096 - xbuf) // self.slot_bytes // groups
        self.stages = self.per * groups
        # launched dependent: the slots a worker asks for before the wait (its first lap)
        self.lap = self.per if early_slots is None else max(0, min(self.per, early_slots))
        self.threads = 128 * (1 + groups)

    # --- host side -------------------------------------------------------------------------
    @cute.jit
    def __call__(self, xq: cute.Tensor, sx: cute.Tensor, wq: cute.Tensor, wsq: cute.Tensor,
                 wkv: cute.Tensor, wskv: cute.Tensor, gamma: cute.Tensor, wb: cute.Tensor,
                 wsb: cute.Tensor, kv_parts: cute.Tensor, q_parts: cute.Tensor,
                 q_rows: cute.Tensor, qb_parts: cute.Tensor, ss: cute.Tensor,
                 arrivals: cute.Tensor, sync: cute.Tensor, acc: cute.Tensor, dump: cute.Tensor,
                 trace: cute.Tensor, kvn: cute.Pointer, positions: cute.Pointer,
                 slots: cute.Pointer, inv_freq: cute.Pointer, cache: cute.Pointer,
                 rows: cute.Pointer, hin: cute.Pointer, rin: cute.Pointer, gin: cute.Pointer,
                 rout: cute.Pointer, ssin: cute.Pointer, stride_slots: cutlass.Int32,
                 grid: cutlass.Int32, stream):
        e4m3 = cutlass.Float8E4M3FN
        tiled_mma, a_layout, b_layout = ring.mma_and_layouts(self.nx, self.stages, self.stages)
        x2_layout = ring.mma_and_layouts(self.nx, 1, self.groups * self.xg)[2]
        tile_a = cute.slice_(a_layout, (None, None, 0))
        atoms = [cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), w, tile_a,
                                             (BLOCK_M, BLOCK_K)) for w in (wq, wkv, wb)]
        tma_x, g_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), xq, cute.slice_(b_layout, (None, None, 0)),
            (self.nx, BLOCK_K))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sa: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(a_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(b_layout)], 1024]
            sx2: cute.struct.Align[cute.struct.MemRange[e4m3, cute.cosize(x2_layout)], 1024]
            scales: cute.struct.MemRange[cutlass.Float32, MAX_ROWS * self.xg * self.groups]
            last: cute.struct.MemRange[cutlass.Int32, self.groups]
            # the fixed form's cross-warp sums and maxima: (row, 1 + xg, warp, worker)
            red: cute.struct.MemRange[cutlass.Float32,
                                      FIXED_MAX_ROWS * (1 + self.xg) * 4 * self.groups]

        self.storage = Storage
        self.kernel(atoms[0][0], atoms[0][1], atoms[1][0], atoms[1][1], atoms[2][0],
                    atoms[2][1], tma_x, g_x, tiled_mma, a_layout, b_layout, x2_layout, sx, wsq,
                    wskv, gamma, wsb, kv_parts, q_parts, q_rows, qb_parts, ss, arrivals,
                    sync, acc, dump, trace, kvn, positions, slots, inv_freq, cache, rows, hin,
                    rin, gin, rout, ssin, stride_slots).launch(
                        grid=[grid, 1, 1], block=[self.threads, 1, 1],
                                 smem=Storage.size_in_bytes(), stream=stream,
                                 use_pdl=self.pdl)

    # --- unit arithmetic -------------------------------------------------------------------
    def _stage1(self, u):
        """(row tile over c_q's tiles then kv's, K chunk) of q_a|kv_a unit u."""
        return u // self.split1, u % self.split1

    def _stage2(self, u):
        """(row tile, K chunk) of q_b unit u (numbered after q_a|kv_a's)."""
        v = u - self.units1
        return v // self.split2, v % self.split2

    # --- producer ----------------------------------------------------------------------------
    @cute.jit
    def _produce(self, pipe, grp, w, workers, tma_q, t_gq, tma_kv, t_gkv, tma_b, t_gb, t_sa,
                 tma_x, t_gx, t_sb, mode: cutlass.Constexpr):
        """Worker w's producer warp: every unit's weight tiles in order into its part of the
        ring; x's tile beside each q_a|kv_a tile (beside a q_b tile a stand-in x tile, so
        that every slot carries the same bytes: q_b's B operand is made in shared memory, and
        with norm_in q_a|kv_a's too).
        mode "all": every slot; launched dependent, "w0": the first lap's weight tiles (before
        the previous kernel is waited for), "x0": its x tiles (after), "rest": the slots
        after the first lap (with late_q_b, "w0" and "x0" take q_a|kv_a's slots only)."""
        own = cutlass.Int32(0)
        # the worker's q_a|kv_a slots
        done1 = (self.units1 - w + workers - 1) // workers * self.chunk1
        for u in cutlass.range(w, self.units, workers, unroll=1):
            first = u < self.units1
            steps = self.chunk1 if first else self.chunk2
            tile, c = self._stage1(u)
            if not first:
                tile, c = self._stage2(u)
            for s in cutlass.range(steps, unroll=1):
                put = ring.ring_state(self.stages, self.per, grp, own, True)
                do_w, do_x = _acts(mode, own < self.lap, own >= self.lap, u < self.units1,
                                   u >= self.units1, self.late_q_b)
                if cutlass.const_expr(self.late_q_b and mode != "w0" and mode != "x0"):
                    if u >= self.units1 and s == 0 and own > 0 and own == done1:
                        # q_b's weights only once this worker's q_a|kv_a tiles have landed:
                        # they are not needed before c_q is, and HBM serves what is asked
                        pipe.consumer_wait(ring.ring_state(self.stages, self.per, grp, own - 1,
                                                           False))
                if do_w:
                    pipe.producer_acquire(put)
                bar = pipe.producer_get_barrier(put)
                if do_w:
                    if first:
                        group = c * self.chunk1 + s
                        if tile < self.tq:
                            cute.copy(tma_q, t_gq[(None, tile, group)], t_sa[(None, put.index)],
                                      tma_bar_ptr=bar)
                        else:
                            cute.copy(tma_kv, t_gkv[(None, tile - self.tq, group)],
                                      t_sa[(None, put.index)], tma_bar_ptr=bar)
                    else:
                        cute.copy(tma_b, t_gb[(None, tile, c * self.chunk2 + s)],
                                  t_sa[(None, put.index)], tma_bar_ptr=bar)
                if do_x:
                    group = 0  # a stand-in where the consumers make the B operand
                    if cutlass.const_expr(not self.norm_in):
                        if first:
                            group = c * self.chunk1 + s
                    cute.copy(tma_x, t_gx[(None, 0, group)], t_sb[(None, put.index)],
                              tma_bar_ptr=bar)
                own = own + 1

    # --- consumers ---------------------------------------------------------------------------
    @cute.jit
    def _mma_steps(self, pipe, grp, own, steps: cutlass.Constexpr, tiled_mma, acc, part, scale,
                   coords, t_ra, t_rb, b_base, ring_b: cutlass.Constexpr, mWs: cute.Tensor,
                   ws_row, g0, mSx: cute.Tensor, scales: cute.Tensor, wsc: cute.Tensor):
        """`steps` ring slots from the worker's `own`-th into acc: each slot's product scaled
        by mWs[ws_row, g0 + step] x its row's x scale (mSx[row, g0 + step] where the slot
        carries its own x tile (ring_b), else scales[row, step, grp] beside the worker's B
        tiles b_base + step of t_rb, the weight scales then already in wsc), loaded before
        the slot is waited for."""
        acc.fill(0.0)
        for s in cutlass.range(steps, unroll=1):
            w_scale = cutlass.Float32(0.0)
            if cutlass.const_expr(ring_b):
                w_scale = mWs[ws_row, g0 + s]
            else:
                w_scale = wsc[s]
            for e in cutlass.range_constexpr(cute.size(acc)):
                r = cutlass.min(coords[e][1], self.m - 1)
                if cutlass.const_expr(ring_b):
                    scale[e] = w_scale * mSx[r, g0 + s]
                else:
                    scale[e] = w_scale * scales[r, s, grp]
            get = ring.ring_state(self.stages, self.per, grp, own + s, False)
            pipe.consumer_wait(get)
            warpgroup.fence()
            b_slot = get.index
            if cutlass.const_expr(not ring_b):
                b_slot = b_base + s
            tiled_mma = ring.group_mma(tiled_mma, part, t_ra, get.index, t_rb, b_slot)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe.consumer_release(get)
            for e in cutlass.range_constexpr(cute.size(acc)):
                acc[e] = acc[e] + part[e] * scale[e]
        return tiled_mma

    @cute.jit
    def _mma1(self, pipe, grp, own, tiled_mma, acc, part, scale, coords, mWs: cute.Tensor,
              ws_row, c, t, mSx: cute.Tensor, first, x1):
        """A q_a|kv_a unit's chunk c into acc: on the ring's x tiles, or with norm_in on the B
        operand it makes first (``_make_x1``; first: tile 0's unit), its weight scales read
        into wsc beforehand. x1: (t_ra, t_rb, t_rx2, s_x2, scales, red, wsc, hin, rin, gin,
        rout, ssin)."""
        t_ra, t_rb, t_rx2, s_x2, scales, red, wsc, hin, rin, gin, rout, ssin = x1
        g0 = c * self.chunk1
        if cutlass.const_expr(self.norm_in):
            for s in cutlass.range_constexpr(self.chunk1):
                wsc[s] = mWs[ws_row, g0 + s]
            self._make_x1(c, t, grp, hin, rin, gin, rout, ssin, s_x2, scales, red, first)
            tiled_mma = self._mma_steps(pipe, grp, own, self.chunk1, tiled_mma, acc, part, scale,
                                        coords, t_ra, t_rx2, grp * self.xg, False, mWs, ws_row,
                                        g0, mSx, scales, wsc)
        else:
            tiled_mma = self._mma_steps(pipe, grp, own, self.chunk1, tiled_mma, acc, part, scale,
                                        coords, t_ra, t_rb, 0, True, mWs, ws_row, g0, mSx,
                                        scales, wsc)
        return tiled_mma

    @cute.jit
    def _store(self, acc, coords, mOut: cute.Tensor, c, tile):
        for e in cutlass.range_constexpr(cute.size(acc)):
            if coords[e][1] < self.m:
                mOut[c, coords[e][1], tile * BLOCK_M + coords[e][0]] = acc[e]

    @cute.jit
    def _arrive(self, last: cute.Tensor, grp, t, counter):
        """ring.arrive without its fence in every thread: the barrier orders the warpgroup's
        stores before thread 0's acq_rel atomic, whose release at gpu scope is cumulative
        (stream_chain_probe measured the fence as a repeat of the atomic's own release)."""
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        if t == 0:
            old = cute.arch.atomic_add(counter, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            last[grp] = cutlass.Int32(0)
            if old == self.split1 - 1:
                last[grp] = cutlass.Int32(1)
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _q_tail(self, tile, t, epoch, mQParts: cute.Tensor, mRows: cute.Tensor,
                mSs: cute.Tensor, mArrivals: cute.Tensor, mSync: cute.Tensor, grp):
        """The last chunk of c_q tile `tile` to arrive: the chunks summed in order into bf16
        rows, each row's sum of squares (of the bf16 values) over the tile's two 32-column
        halves, then the tile's flag (release)."""
        cute.arch.fence_acq_rel_gpu()
        lane, warp = t % 32, t // 32
        n = tile * BLOCK_M + t % BLOCK_M
        half = t // BLOCK_M
        # every load before any store (a store between them could alias, for all the
        # compiler knows, and would hold the next row's loads back a round trip)
        sums = cute.make_rmem_tensor(((self.m + 1) // 2,), cutlass.Float32)
        for i in cutlass.range_constexpr((self.m + 1) // 2):
            r = cutlass.min(2 * i + half, self.m - 1)
            sums[i] = mQParts[0, r, n]
        for c in cutlass.range_constexpr(1, self.split1):
            for i in cutlass.range_constexpr((self.m + 1) // 2):
                r = cutlass.min(2 * i + half, self.m - 1)
                sums[i] = sums[i] + mQParts[c, r, n]
        for i in cutlass.range_constexpr((self.m + 1) // 2):
            r = 2 * i + half
            v = sums[i].to(cutlass.BFloat16)
            if r < self.m:
                mRows[r, n] = v
            sq = v.to(cutlass.Float32) * v.to(cutlass.Float32)
            for x in cutlass.range_constexpr(5):
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=16 >> x)
            if lane == 0 and r < self.m:
                mSs[2 * tile + warp % 2, r] = sq
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        if t == 0:
            mArrivals[tile] = cutlass.Int32(0)
            cute.arch.fence_acq_rel_gpu()
            cute.arch.store(mSync.iterator + FLAGS + tile, epoch, sem="relaxed", scope="gpu")

    @cute.jit
    def _wait_q(self, t, words, n: cutlass.Constexpr, target, mSync: cute.Tensor, grp):
        """Until each of n tiles' words (words + tile: a c_q tile's flag, or in the fixed form
        a tile's count) holds `target` (acquire, then the warpgroup)."""
        if t < n:
            ptr = words + t
            spins = cutlass.Int32(0)
            seen = cute.arch.load(ptr, cutlass.Int32, sem="relaxed", scope="gpu")
            while seen != target and spins < SPIN_LIMIT:
                seen = cute.arch.load(ptr, cutlass.Int32, sem="relaxed", scope="gpu")
                spins = spins + 1
            if seen != target:
                mSync[FAILED] = cutlass.Int32(1)
            cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    # --- the fixed form ----------------------------------------------------------------------
    @cute.jit
    def _zero_next(self, w, workers, t, p, mAcc: cute.Tensor, mArrivals: cute.Tensor):
        """The other parity's sums and counts, zeroed for the next launch: this launch's wait
        saw the previous one (their last reader) finish, and the next one adds into them only
        after its own wait sees this one finish."""
        width = self.shape.nq + self.shape.nkv
        for i in cutlass.range(w * 128 + t, self.m * width, workers * 128, unroll=1):
            mAcc[1 - p, i // width, i % width] = cutlass.Int64(0)
        if w == 0 and t < self.tiles1:
            mArrivals[(1 - p) * self.tiles1 + t] = cutlass.Int32(0)

    @cute.jit
    def _chunk_add(self, acc, coords, mAcc: cute.Tensor, mArrivals: cute.Tensor, p, tile, t,
                   grp):
        """A q_a|kv_a unit's chunk added into the sums in 2^-FIXED_BITS units (relaxed atomics:
        any order gives the same integers), then its tile's count (release, after the
        warpgroup's barrier: cumulative, as ``_arrive``). Tile t's columns are t * 64.. of
        the sums' c_q | kv_a row."""
        width = self.shape.nq + self.shape.nkv
        for e in cutlass.range_constexpr(cute.size(acc)):
            r = coords[e][1]
            if r < self.m:
                v = (acc[e] * float(2 ** FIXED_BITS)).to(cutlass.Int64)
                at = (p * self.m + r) * width + tile * BLOCK_M + coords[e][0]
                cute.arch.atomic_add(mAcc.iterator + at, v, sem="relaxed", scope="gpu")
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        if t == 0:
            cute.arch.atomic_add(mArrivals.iterator + p * self.tiles1 + tile, cutlass.Int32(1),
                                 sem="release", scope="gpu")

    @cute.jit
    def _group_e4m3(self, y, red: cute.Tensor, r, g, grp):
        """(y as e4m3, its scale): the scale max(amax, 1e-10) / 448 of row r's 128-column
        group g, whose amax the warpgroup's four warps left in red[r, 1 + g, :, grp]."""
        amax = cute.arch.fmax(cute.arch.fmax(red[r, 1 + g, 0, grp], red[r, 1 + g, 1, grp]),
                              cute.arch.fmax(red[r, 1 + g, 2, grp], red[r, 1 + g, 3, grp]))
        s = cute.arch.fmax(amax, ACT_EPS) / FP8_MAX
        q = cute.arch.fmax(cute.arch.fmin(y * (1.0 / s), FP8_MAX), -FP8_MAX)
        return q.to(cutlass.Float8E4M3FN), s

    @cute.jit
    def _make_x2_fixed(self, c, t, grp, p, mAcc: cute.Tensor, mRows: cute.Tensor,
                       gam: cute.Tensor, s_x2: cute.Tensor, scales: cute.Tensor,
                       red: cute.Tensor, mDump: cute.Tensor, first, rstd_in: cute.Tensor):
        """``_make_x2`` from the fixed sums: thread t reads column t of every 128-column group
        of each row (the whole row: its sum of squares) and of the unit's groups (loaded apart,
        so no register array is indexed by the unit's chunk), all before any use; c_q rounded
        to bf16 from the sums; the row's sums and each group's amax reduced across the
        warpgroup's four warps through shared memory. The first tile's units (first) also
        write their columns of c_q's bf16 rows (and the dump). norm_in: the sums are of the
        un-normed input row, so each is times its row's rstd_in before rounding."""
        nq = self.shape.nq
        ng = nq // BLOCK_K
        lane, wi = t % 32, t // 32
        unit = 1.0 / float(2 ** FIXED_BITS)
        whole = cute.make_rmem_tensor((self.m * ng,), cutlass.Int64)
        own = cute.make_rmem_tensor((self.m * self.chunk2,), cutlass.Int64)
        for r in cutlass.range_constexpr(self.m):
            for i in cutlass.range_constexpr(ng):
                whole[r * ng + i] = mAcc[p, r, i * BLOCK_K + t]
            for g in cutlass.range_constexpr(self.chunk2):
                own[r * self.chunk2 + g] = mAcc[p, r, (c * self.chunk2 + g) * BLOCK_K + t]
        # no load moves across a fence: without it each load was sunk to its conversion and
        # the later loads waited (m=2: ~6 in flight, the prologue 2.8 us in the trace)
        cute.arch.fence_acq_rel_cta()
        for r in cutlass.range_constexpr(self.m):
            sq = cutlass.Float32(0.0)
            for i in cutlass.range_constexpr(ng):
                v = whole[r * ng + i].to(cutlass.Float32) * unit
                if cutlass.const_expr(self.norm_in):
                    v = v * rstd_in[r]
                v = v.to(cutlass.BFloat16)
                sq = sq + v.to(cutlass.Float32) * v.to(cutlass.Float32)
            for x in cutlass.range_constexpr(5):
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=16 >> x)
            if lane == 0:
                red[r, 0, wi, grp] = sq
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        ys = cute.make_rmem_tensor((self.m * self.chunk2,), cutlass.Float32)
        for r in cutlass.range_constexpr(self.m):
            total = red[r, 0, 0, grp] + red[r, 0, 1, grp] + red[r, 0, 2, grp] + red[r, 0, 3, grp]
            rstd = cute.math.rsqrt(total / nq + self.eps)
            for g in cutlass.range_constexpr(self.chunk2):
                col = (c * self.chunk2 + g) * BLOCK_K + t
                v = own[r * self.chunk2 + g].to(cutlass.Float32) * unit
                if cutlass.const_expr(self.norm_in):
                    v = v * rstd_in[r]
                v = v.to(cutlass.BFloat16)
                if first:
                    mRows[r, col] = v
                y = (v.to(cutlass.Float32) * rstd * gam[g]).to(cutlass.BFloat16)
                ys[r * self.chunk2 + g] = y.to(cutlass.Float32)
                amax = cute.arch.fmax(ys[r * self.chunk2 + g], -ys[r * self.chunk2 + g])
                for x in cutlass.range_constexpr(5):
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax,
                                                                             offset=16 >> x))
                if lane == 0:
                    red[r, 1 + g, wi, grp] = amax
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        for r in cutlass.range_constexpr(self.m):
            for g in cutlass.range_constexpr(self.chunk2):
                q8, s = self._group_e4m3(ys[r * self.chunk2 + g], red, r, g, grp)
                s_x2[r, t, grp * self.xg + g] = q8
                if cutlass.const_expr(self.dump):
                    if first:
                        mDump[r, (c * self.chunk2 + g) * BLOCK_K + t] = q8.to(cutlass.Float32) * s
                if t == 0:
                    scales[r, g, grp] = s
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _make_x1(self, c, t, grp, hin: cute.Pointer, rin: cute.Pointer, gin: cute.Pointer,
                 rout: cute.Pointer, ssin: cute.Pointer, s_x2: cute.Tensor,
                 scales: cute.Tensor, red: cute.Tensor, first):
        """norm_in: q_a|kv_a unit chunk c's B operand from the un-normed rows, as
        ``norm_router`` makes gate/up's: s = hidden + residual in fp32, bf16(s * weight) as
        e4m3 with one scale per row and 128 columns (the row's rstd left out: its consumers
        multiply by it), into the worker's B buffer (rows past M stay zero). Thread t takes
        column t of each of the chunk's groups, every load issued before any use. The first
        tile's units (first) also write the chunk's new residual bf16(s) into rout (never the
        residual read: other units read it) and its sum of squares of s, a row's into
        ssin[c * M + row]."""
        k1 = self.shape.k1
        lane, wi = t % 32, t // 32
        hv = cute.make_tensor(hin, cute.make_layout(self.m * k1))
        rv = cute.make_tensor(rin, cute.make_layout(self.m * k1))
        gv = cute.make_tensor(gin, cute.make_layout(k1))
        ov = cute.make_tensor(rout, cute.make_layout(self.m * k1))
        hb = cute.make_rmem_tensor((self.m * self.chunk1,), cutlass.BFloat16)
        rb = cute.make_rmem_tensor((self.m * self.chunk1,), cutlass.BFloat16)
        gb = cute.make_rmem_tensor((self.chunk1,), cutlass.BFloat16)
        for g in cutlass.range_constexpr(self.chunk1):
            col = (c * self.chunk1 + g) * BLOCK_K + t
            gb[g] = gv[col]
            for r in cutlass.range_constexpr(self.m):
                hb[r * self.chunk1 + g] = hv[r * k1 + col]
                rb[r * self.chunk1 + g] = rv[r * k1 + col]
        cute.arch.fence_acq_rel_cta()  # every load in flight before any use (_make_x2_fixed)
        ys = cute.make_rmem_tensor((self.m * self.chunk1,), cutlass.Float32)
        for r in cutlass.range_constexpr(self.m):
            sq = cutlass.Float32(0.0)
            for g in cutlass.range_constexpr(self.chunk1):
                v = hb[r * self.chunk1 + g].to(cutlass.Float32) + \
                    rb[r * self.chunk1 + g].to(cutlass.Float32)
                if first:
                    ov[r * k1 + (c * self.chunk1 + g) * BLOCK_K + t] = v.to(cutlass.BFloat16)
                sq = sq + v * v
                y = (v * gb[g].to(cutlass.Float32)).to(cutlass.BFloat16).to(cutlass.Float32)
                ys[r * self.chunk1 + g] = y
                amax = cute.arch.fmax(y, -y)
                for x in cutlass.range_constexpr(5):
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax,
                                                                             offset=16 >> x))
                if lane == 0:
                    red[r, 1 + g, wi, grp] = amax
            if first:
                for x in cutlass.range_constexpr(5):
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=16 >> x)
                if lane == 0:
                    red[r, 0, wi, grp] = sq
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        ssv = cute.make_tensor(ssin, cute.make_layout(self.split1 * self.m))
        for r in cutlass.range_constexpr(self.m):
            if first and t == 0:
                ssv[c * self.m + r] = (red[r, 0, 0, grp] + red[r, 0, 1, grp] + red[r, 0, 2, grp]
                                       + red[r, 0, 3, grp])
            for g in cutlass.range_constexpr(self.chunk1):
                q8, sc = self._group_e4m3(ys[r * self.chunk1 + g], red, r, g, grp)
                s_x2[r, t, grp * self.xg + g] = q8
                if t == 0:
                    scales[r, g, grp] = sc
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _rstd_in(self, ssin: cute.Pointer, r):
        """norm_in: row r's rstd of the un-normed input row from the chunks' sums of squares
        (``_make_x1``), added in chunk order."""
        ssv = cute.make_tensor(ssin, cute.make_layout(self.split1 * self.m))
        raw = cute.make_rmem_tensor((self.split1,), cutlass.Float32)
        for c in cutlass.range_constexpr(self.split1):
            raw[c] = ssv[c * self.m + r]
        total = raw[0]
        for c in cutlass.range_constexpr(1, self.split1):
            total = total + raw[c]
        return cute.math.rsqrt(total / self.shape.k1 + self.eps)

    @cute.jit
    def _gamma(self, c, t, gam: cute.Tensor, mGamma: cute.Tensor):
        """gamma of the columns thread t norms in q_b unit chunk c (``_make_x2``): read before
        the unit waits for c_q."""
        j = t % self.lanes
        for g in cutlass.range_constexpr(self.chunk2):
            for i in cutlass.range_constexpr(self.cols):
                gam[g * self.cols + i] = mGamma[(c * self.chunk2 + g) * BLOCK_K + j * self.cols
                                                + i].to(cutlass.Float32)

    @cute.jit
    def _zero_pad_rows(self, t, grp, s_x2: cute.Tensor):
        """x rows M..nx-1 of the worker's B tiles, zero once: the MMA reads them, no output
        keeps their columns, and _make_x2 writes real rows only."""
        pad = (self.nx - self.m) * BLOCK_K
        for g in cutlass.range_constexpr(self.xg):
            for i in cutlass.range(t, pad, 128, unroll=1):
                s_x2[self.m + i // BLOCK_K, i % BLOCK_K, grp * self.xg + g] = \
                    cutlass.Float32(0.0).to(cutlass.Float8E4M3FN)

    @cute.jit
    def _make_x2(self, c, t, grp, mRows: cute.Tensor, mSs: cute.Tensor, gam: cute.Tensor,
                 s_x2: cute.Tensor, scales: cute.Tensor, mDump: cute.Tensor, dump):
        """q_b unit's B operand: its K chunk's 128-column groups of rms_norm(c_q) * gamma,
        rounded to bf16, as e4m3 with one scale per row and group (rows past M stay zero).
        Thread t takes row t // lanes and `cols` columns of each group (lanes = 128 / M
        rounded up to a power of two, at most 32: few rows, few columns a thread); its row's
        lanes reduce together (a butterfly, so each gets the same sum). Every load is issued
        before any use."""
        lanes, cols = self.lanes, self.cols
        row, j = t // lanes, t % lanes
        r = cutlass.min(row, self.m - 1)
        n_ss = -(-2 * self.tq // lanes)
        parts = cute.make_rmem_tensor((n_ss,), cutlass.Float32)
        vals = cute.make_rmem_tensor((self.chunk2 * cols,), cutlass.Float32)
        for i in cutlass.range_constexpr(n_ss):
            parts[i] = mSs[cutlass.min(j + lanes * i, 2 * self.tq - 1), r]
        for g in cutlass.range_constexpr(self.chunk2):
            for i in cutlass.range_constexpr(cols):
                vals[g * cols + i] = mRows[r, (c * self.chunk2 + g) * BLOCK_K + j * cols
                                           + i].to(cutlass.Float32)
        total = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(n_ss):
            if j + lanes * i < 2 * self.tq:
                total = total + parts[i]
        for x in cutlass.range_constexpr(self.lane_bits):
            total = total + cute.arch.shuffle_sync_bfly(total, offset=(lanes // 2) >> x)
        rstd = cute.math.rsqrt(total / self.shape.nq + self.eps)
        for g in cutlass.range_constexpr(self.chunk2):
            col0 = (c * self.chunk2 + g) * BLOCK_K + j * cols
            amax = cutlass.Float32(0.0)
            for i in cutlass.range_constexpr(cols):
                v = vals[g * cols + i] * rstd
                v = (v * gam[g * cols + i]).to(cutlass.BFloat16).to(cutlass.Float32)
                vals[g * cols + i] = v
                amax = cute.arch.fmax(amax, cute.arch.fmax(v, -v))
            for x in cutlass.range_constexpr(self.lane_bits):
                amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(
                    amax, offset=(lanes // 2) >> x))
            s = cute.arch.fmax(amax, ACT_EPS) / FP8_MAX
            inv = 1.0 / s
            if row < self.m:
                for i in cutlass.range_constexpr(cols):
                    q = cute.arch.fmax(cute.arch.fmin(vals[g * cols + i] * inv, FP8_MAX),
                                       -FP8_MAX)
                    q8 = q.to(cutlass.Float8E4M3FN)
                    s_x2[row, j * cols + i, grp * self.xg + g] = q8
                    if cutlass.const_expr(self.dump):
                        if dump:
                            mDump[row, col0 + i] = q8.to(cutlass.Float32) * s
                if j == 0:
                    scales[row, g, grp] = s
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _kv_row(self, r, t, grp, p, mAcc: cute.Tensor, mArrivals: cute.Tensor,
                mSync: cute.Tensor, kvn: cute.Pointer, positions: cute.Pointer,
                slots: cute.Pointer, rows: cute.Pointer, stride_slots, inv_freq: cute.Pointer,
                cache: cute.Pointer, red: cute.Tensor, ssin: cute.Pointer):
        """Row r's KV-cache row (the latent kernel's, ``mla._latent_row`` part 1), once kv_a's
        tiles are counted in: c_kv rounded to bf16 from the sums, divided by its rms, times
        the norm weight, k_pe's interleaved pairs rotated by the row's position; into the slot
        the row's table row (``by_rows``: the pool table's row rows[r]) holds at its position.
        A pad row (position -1) writes nothing. Thread t
        takes column t of each 128 of c_kv and (t < ROPE / 2) k_pe's pair t. norm_in: the sums
        are of the un-normed input row, times its rstd (c_q tile 0's count seen too) before
        rounding."""
        nq, c_cols = self.shape.nq, self.kv_c
        width = c_cols + ROPE
        lane, wi = t % 32, t // 32
        unit = 1.0 / float(2 ** FIXED_BITS)
        pos = cute.make_tensor(positions, cute.make_layout(self.m))[r]
        at = cutlass.Int64(0)
        if pos >= 0:
            tr = cutlass.Int64(r)
            if cutlass.const_expr(self.by_rows):
                tr = cute.make_tensor(rows, cute.make_layout(self.m))[r]
            table = cute.make_tensor(slots + tr * stride_slots.to(cutlass.Int64),
                                     cute.make_layout(stride_slots))
            at = table[pos.to(cutlass.Int32)].to(cutlass.Int64) * width
        gam = cute.make_rmem_tensor((c_cols // 128,), cutlass.Float32)
        for j in cutlass.range_constexpr(c_cols // 128):
            gam[j] = cute.make_tensor(kvn, cute.make_layout(c_cols))[j * 128 + t].to(
                cutlass.Float32)
        half = t % (ROPE // 2)
        freq = cute.make_tensor(inv_freq, cute.make_layout(ROPE // 2))[half]
        self._wait_q(t, mArrivals.iterator + p * self.tiles1 + self.tq, self.tkv, self.split1,
                     mSync, grp)
        rs = cutlass.Float32(1.0)
        if cutlass.const_expr(self.norm_in):
            self._wait_q(t, mArrivals.iterator + p * self.tiles1, 1, self.split1, mSync, grp)
            rs = self._rstd_in(ssin, r)
        raw = cute.make_rmem_tensor((c_cols // 128 + 2,), cutlass.Int64)
        for j in cutlass.range_constexpr(c_cols // 128):
            raw[j] = mAcc[p, r, nq + j * 128 + t]
        raw[c_cols // 128] = mAcc[p, r, nq + c_cols + 2 * half]
        raw[c_cols // 128 + 1] = mAcc[p, r, nq + c_cols + 2 * half + 1]
        cute.arch.fence_acq_rel_cta()  # every load in flight before any use (_make_x2_fixed)
        sq = cutlass.Float32(0.0)
        cv = cute.make_rmem_tensor((c_cols // 128,), cutlass.Float32)
        if cutlass.const_expr(self.norm_in):
            unit = unit * rs
        for j in cutlass.range_constexpr(c_cols // 128):
            v = (raw[j].to(cutlass.Float32) * unit).to(cutlass.BFloat16).to(cutlass.Float32)
            cv[j] = v
            sq = sq + v * v
        for x in cutlass.range_constexpr(5):
            sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=16 >> x)
        if lane == 0:
            red[0, 0, wi, grp] = sq
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
        total = red[0, 0, 0, grp] + red[0, 0, 1, grp] + red[0, 0, 2, grp] + red[0, 0, 3, grp]
        rms = cute.math.sqrt(total / c_cols + self.eps)
        if pos >= 0:
            row = cute.make_tensor(cache + at, cute.make_layout(width))
            for j in cutlass.range_constexpr(c_cols // 128):
                row[j * 128 + t] = (cv[j] / rms * gam[j]).to(cutlass.BFloat16)
            if t < ROPE // 2:
                x1 = (raw[c_cols // 128].to(cutlass.Float32) * unit).to(cutlass.BFloat16).to(
                    cutlass.Float32)
                x2 = (raw[c_cols // 128 + 1].to(cutlass.Float32) * unit).to(
                    cutlass.BFloat16).to(cutlass.Float32)
                f = pos.to(cutlass.Float32) * freq
                cs, sn = cute.math.cos(f), cute.math.sin(f)
                row[c_cols + 2 * t] = (x1 * cs - x2 * sn).to(cutlass.BFloat16)
                row[c_cols + 2 * t + 1] = (x2 * cs + x1 * sn).to(cutlass.BFloat16)
        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)

    @cute.jit
    def _mark(self, mTrace: cute.Tensor, w, t, point: cutlass.Constexpr):
        """Measurement only: worker w's %globaltimer at TRACE_POINTS[point] (thread 0)."""
        if cutlass.const_expr(self.trace):
            if t == 0 and w < TRACE_WORKERS:
                mTrace[w, point] = cute.arch.globaltimer().to(cutlass.Int64)

    # --- the kernel ------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mWq: cute.Tensor, tma_kv: cute.CopyAtom,
               mWkv: cute.Tensor, tma_b: cute.CopyAtom, mWb: cute.Tensor, tma_x: cute.CopyAtom,
               mX: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               b_layout: cute.ComposedLayout, x2_layout: cute.ComposedLayout,
               mSx: cute.Tensor, mWsq: cute.Tensor, mWskv: cute.Tensor, mGamma: cute.Tensor,
               mWsb: cute.Tensor, mKvParts: cute.Tensor, mQParts: cute.Tensor, mRows: cute.Tensor,
               mQbParts: cute.Tensor, mSs: cute.Tensor, mArrivals: cute.Tensor,
               mSync: cute.Tensor, mAcc: cute.Tensor, mDump: cute.Tensor, mTrace: cute.Tensor,
               kvn: cute.Pointer, positions: cute.Pointer, slots: cute.Pointer,
               inv_freq: cute.Pointer, cache: cute.Pointer, rows: cute.Pointer,
               hin: cute.Pointer, rin: cute.Pointer, gin: cute.Pointer, rout: cute.Pointer,
               ssin: cute.Pointer, stride_slots: cutlass.Int32):
        groups = self.groups
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        workers = grid * groups
        if warp == 0:
            for atom in (tma_q, tma_kv, tma_b, tma_x):
                cpasync.prefetch_descriptor(atom)
        if cutlass.const_expr(self.pdl and self.early_dependents):
            cute.arch.griddepcontrol_launch_dependents()

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        s_a = storage.sa.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        s_b = storage.sb.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        s_x2 = storage.sx2.get_tensor(x2_layout.outer, swizzle=x2_layout.inner)
        scales = storage.scales.get_tensor(cute.make_layout((MAX_ROWS, self.xg, groups)))
        pipe = ring.make_pipe(storage.bars.data_ptr(), self.stages, self.slot_bytes)

        def part_tma(atom, mat, smem, shape):
            return cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                         cute.group_modes(smem, 0, 2),
                                         cute.group_modes(cute.local_tile(mat, shape,
                                                                          (None, None)), 0, 2))

        t_sa, t_gq = part_tma(tma_q, mWq, s_a, (BLOCK_M, BLOCK_K))
        _, t_gkv = part_tma(tma_kv, mWkv, s_a, (BLOCK_M, BLOCK_K))
        _, t_gb = part_tma(tma_b, mWb, s_a, (BLOCK_M, BLOCK_K))
        t_sb, t_gx = part_tma(tma_x, mX, s_b, (self.nx, BLOCK_K))

        epoch = cutlass.Int32(0)
        if warp < groups:
            args = (pipe, warp, warp * grid + bidx, workers, tma_q, t_gq, tma_kv, t_gkv, tma_b,
                    t_gb, t_sa, tma_x, t_gx, t_sb)
            if cutlass.const_expr(self.pdl):
                self._produce(*args, "w0")
                cute.arch.griddepcontrol_wait()
                self._produce(*args, "x0")
                self._produce(*args, "rest")
            else:
                self._produce(*args, "all")
        elif wg >= 1:
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            epoch = mSync[EPOCH]
            grp = wg - 1
            t = tidx % 128
            w = grp * grid + bidx
            self._mark(mTrace, w, t, 0)
            thr_mma = tiled_mma.get_slice(t)
            t_ra = tiled_mma.make_fragment_A(thr_mma.partition_A(s_a))
            t_rb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
            t_rx2 = tiled_mma.make_fragment_B(thr_mma.partition_B(s_x2))
            coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, self.nx)))
            acc = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            part = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            scale = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            last = storage.last.get_tensor(cute.make_layout(groups))
            gam = cute.make_rmem_tensor((self.chunk2 * self.cols,), cutlass.Float32)
            wsc = cute.make_rmem_tensor((self.xg,), cutlass.Float32)
            rstd_in = cute.make_rmem_tensor((FIXED_MAX_ROWS,), cutlass.Float32)
            own = cutlass.Int32(0)
            if cutlass.const_expr(self.nx > self.m):
                self._zero_pad_rows(t, grp, s_x2)
            red = storage.red.get_tensor(cute.make_layout((FIXED_MAX_ROWS, 1 + self.xg, 4,
                                                           groups)))
            p = epoch % 2  # the fixed form's parity: this launch's sums and counts
            if cutlass.const_expr(self.fixed):
                self._zero_next(w, workers, t, p, mAcc, mArrivals)
            for u in cutlass.range(w, self.units + self.kv_tasks, workers, unroll=1):
                if u >= self.units:
                    if cutlass.const_expr(self.fixed):
                        self._kv_row(u - self.units, t, grp, p, mAcc, mArrivals, mSync, kvn,
                                     positions, slots, rows, stride_slots, inv_freq, cache,
                                     red, ssin)
                elif u < self.units1:
                    tile, c = self._stage1(u)
                    x1 = (t_ra, t_rb, t_rx2, s_x2, scales, red, wsc, hin, rin, gin, rout, ssin)
                    if tile < self.tq:
                        tiled_mma = self._mma1(pipe, grp, own, tiled_mma, acc, part, scale,
                                               coords, mWsq, tile // 2, c, t, mSx, tile == 0, x1)
                        self._mark(mTrace, w, t, 1)
                        if cutlass.const_expr(self.fixed):
                            self._chunk_add(acc, coords, mAcc, mArrivals, p, tile, t, grp)
                            self._mark(mTrace, w, t, 2)
                        else:
                            self._store(acc, coords, mQParts, c, tile)
                            self._arrive(last, grp, t, mArrivals.iterator + tile)
                            self._mark(mTrace, w, t, 2)
                            if last[grp] == 1:
                                self._q_tail(tile, t, epoch, mQParts, mRows, mSs, mArrivals,
                                             mSync, grp)
                                self._mark(mTrace, w, t, 3)
                    else:
                        kt = tile - self.tq
                        tiled_mma = self._mma1(pipe, grp, own, tiled_mma, acc, part, scale,
                                               coords, mWskv, kt // 2, c, t, mSx, False, x1)
                        self._mark(mTrace, w, t, 1)
                        if cutlass.const_expr(self.fixed):
                            self._chunk_add(acc, coords, mAcc, mArrivals, p, tile, t, grp)
                        else:
                            self._store(acc, coords, mKvParts, c, kt)
                    own = own + self.chunk1
                else:
                    tile, c = self._stage2(u)
                    # what does not depend on c_q, before its wait
                    self._gamma(c, t, gam, mGamma)
                    for s in cutlass.range_constexpr(self.chunk2):
                        wsc[s] = mWsb[tile // 2, c * self.chunk2 + s]
                    if cutlass.const_expr(self.fixed):
                        self._wait_q(t, mArrivals.iterator + p * self.tiles1, self.tq,
                                     self.split1, mSync, grp)
                        self._mark(mTrace, w, t, 4)
                        if cutlass.const_expr(self.norm_in):
                            for r in cutlass.range_constexpr(self.m):
                                rstd_in[r] = self._rstd_in(ssin, r)
                        self._make_x2_fixed(c, t, grp, p, mAcc, mRows, gam, s_x2, scales, red,
                                            mDump, tile == 0, rstd_in)
                    else:
                        self._wait_q(t, mSync.iterator + FLAGS, self.tq, epoch, mSync, grp)
                        self._mark(mTrace, w, t, 4)
                        self._make_x2(c, t, grp, mRows, mSs, gam, s_x2, scales, mDump,
                                      tile == 0)
                    self._mark(mTrace, w, t, 5)
                    tiled_mma = self._mma_steps(pipe, grp, own, self.chunk2, tiled_mma, acc, part,
                                                scale, coords, t_ra, t_rx2, grp * self.xg,
                                                False, mWsb, tile // 2, c * self.chunk2, mSx,
                                                scales, wsc)
                    self._store(acc, coords, mQbParts, c, tile)
                    self._mark(mTrace, w, t, 6)
                    own = own + self.chunk2
        # the last CTA to finish moves the epoch on for the next launch
        cute.arch.barrier()
        if wg >= 1:
            self._mark(mTrace, (wg - 1) * grid + bidx, tidx % 128, 7)
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            done = cute.arch.atomic_add(mSync.iterator + DONE, cutlass.Int32(1), sem="acq_rel",
                                        scope="gpu")
            if done == grid - 1:
                mSync[DONE] = cutlass.Int32(0)
                mSync[EPOCH] = mSync[EPOCH] + 1


class Work(NamedTuple):
    """A launch's scratch and outputs besides kv_parts / q_rows / qb_parts (made once, kept:
    the flags' epochs carry from launch to launch)."""
    q_parts: "object"  # fp32 [S1, M, NQ]: c_q's K chunks
    ss: "object"  # fp32 [2 NQ / 64, M]: each c_q half tile's sums of squares
    arrivals: "object"  # int32 [NQ / 64], zero between launches
    sync: "object"  # int32 [FLAGS + NQ / 64]: epoch, done count, failure, the tiles' flags
    # the fixed form: int64 [2, M, NQ + NKV], q_a|kv_a's sums in 2^-FIXED_BITS units by the
    # epoch's parity (zero at first; arrivals then int32 [2 (NQ + NKV) / 64], the tiles'
    # counts likewise); otherwise int64 [1, 1, 1], never read
    acc: "object" = None
    # the fixed form: fp32 [S1, M, NKV], the kv_parts argument it never writes (a caller may
    # pass None for kv_parts); otherwise None
    kv_stub: "object" = None
    # the fixed form: fp32 [S1 * M], norm_in's sums of squares of the input row by K chunk
    # (written by tile 0's units each launch before they count in); otherwise None
    ss_in: "object" = None


def workspace(side: AttnSide, device) -> Work:
    import torch
    sync = torch.zeros(FLAGS + side.tq, dtype=torch.int32, device=device)
    sync[EPOCH] = 1
    stub = (torch.empty(side.split1, side.m, side.shape.nkv, device=device) if side.fixed
            else None)
    ss_in = torch.empty(side.split1 * side.m, device=device) if side.fixed else None
    return Work(torch.empty(side.split1, side.m, side.shape.nq, device=device),
                torch.empty(2 * side.tq, side.m, device=device),
                torch.zeros(_counts(side), dtype=torch.int32, device=device), sync,
                torch.zeros(_acc_shape(side), dtype=torch.int64, device=device), stub, ss_in)


def _acc_shape(side: AttnSide) -> tuple:
    return (2, side.m, side.shape.nq + side.shape.nkv) if side.fixed else (1, 1, 1)


def _counts(side: AttnSide) -> int:
    """arrivals' length: the c_q tiles' counters, or (fixed) every tile's count by parity."""
    return 2 * side.tiles1 if side.fixed else side.tq


def check_sync(work: Work) -> None:
    """Raise if a wait of a launch so far gave up (reads the GPU: not inside a graph)."""
    if int(work.sync[FAILED].item()):
        raise RuntimeError("attn_side: a wait for c_q's tiles gave up after SPIN_LIMIT polls "
                           "(were all CTAs resident? the grid must not exceed the SMs free)")


@functools.lru_cache(maxsize=None)
def compiled(m: int, shape: Shape = Shape(), split1: int = 0, split2: int = 0,
             eps: float = 1e-5, groups: int = GROUPS, pdl: bool = True, first_only: bool = False,
             dump: bool = False, trace: bool = False, late_q_b: bool = True,
             fixed: bool = False, by_rows: bool = False, table_bits: int = 32,
             early_dependents: bool = True, early_slots=None, norm_in: bool = False):
    """(the AttnSide, its compiled launch) for one row count and shape (table_bits: the
    slot table's integer width, 32 or 64)."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack, make_ptr

    side = AttnSide(m, shape, split1, split2, eps, groups, pdl, first_only, dump, trace,
                    late_q_b, fixed, by_rows, early_dependents, early_slots, norm_in)
    e4m3 = torch.float8_e4m3fn
    nq, nkv, k1, nb = shape
    dummy = (torch.empty(side.nx, k1, dtype=e4m3), torch.empty(m, k1 // 128),
             torch.empty(nq, k1, dtype=e4m3), torch.empty(nq // 128, k1 // 128),
             torch.empty(nkv, k1, dtype=e4m3), torch.empty(-(-nkv // 128), k1 // 128),
             torch.empty(nq, dtype=torch.bfloat16), torch.empty(nb, nq, dtype=e4m3),
             torch.empty(nb // 128 if nb % 128 == 0 else nb // 128 + 1, nq // 128),
             torch.empty(side.split1, m, nkv), torch.empty(side.split1, m, nq),
             torch.empty(m, nq, dtype=torch.bfloat16), torch.empty(side.split2, m, nb),
             torch.empty(2 * side.tq, m),
             torch.empty(_counts(side), dtype=torch.int32),
             torch.empty(FLAGS + side.tq, dtype=torch.int32),
             torch.empty(_acc_shape(side), dtype=torch.int64), torch.empty(m, nq),
             torch.empty(TRACE_WORKERS, len(TRACE_POINTS), dtype=torch.int64))
    fn = cute.compile(side, *(from_dlpack(t, assumed_align=16) for t in dummy),
                      *(make_ptr(dt, 16, cute.AddressSpace.gmem, align)
                        for dt, align in _kv_ptrs(table_bits) + _NORM_IN_PTRS),
                      1, 1, cuda.CUstream(0))
    return side, fn


def _kv_ptrs(table_bits: int) -> tuple:
    """The KV-row arguments as pointers (kv_norm, positions, the slot table, inv_freq, the
    cache, the pool table's rows: any cache and table sizes under one compiled form), with
    their alignments in bytes."""
    table = (cutlass.Int32, 4) if table_bits == 32 else (cutlass.Int64, 8)
    return ((cutlass.BFloat16, 2), (cutlass.Int64, 8), table, (cutlass.Float32, 4),
            (cutlass.BFloat16, 2), (cutlass.Int64, 8))


# norm_in's pointers (hidden, residual, the norm's weight, the new residual: bf16; the sums
# of squares: fp32) with their alignments in bytes
_NORM_IN_PTRS = ((cutlass.BFloat16, 2),) * 4 + ((cutlass.Float32, 4),)


def _check(name: str, t, shape: tuple, dtype) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"attn_side: {name} must be a contiguous {dtype} {tuple(shape)}, got "
                         f"{t.dtype} {tuple(t.shape)}")


def attn_side(xq, sx, wq, wsq, wkv, wskv, gamma, wb, wsb, kv_parts, q_rows, qb_parts,
              work: Work, eps: float = 1e-5, grid: int = 0, pdl: bool = True,
              first_only: bool = False, dump=None, trace=None, late_q_b: bool = True,
              fixed: bool = False, kv_norm=None, positions=None, token_slots=None,
              inv_freq=None, kv_cache=None, slot_rows=None,
              early_dependents: bool = True, early_slots=None, norm_in=None) -> None:
    """q_a|kv_a then q_b in one launch on the current torch stream (the module docstring);
    graph-capturable. Shapes: xq e4m3 [>= x_rows(M), K1], sx fp32 [M, K1/128]; wq e4m3
    [NQ, K1], wkv [NKV, K1], wb [NB, NQ] with fp32 block scales; gamma bf16 [NQ]; outputs
    kv_parts fp32 [S1, M, NKV], q_rows bf16 [M, NQ], qb_parts fp32 [S2, M, NB]; S1 and S2 are
    the launch's K splits (``compiled(M, shape)[0].split1 / .split2``); work from
    ``workspace``. grid: CTAs (default: every SM; each must be resident). pdl: launched
    programmatically dependent on the previous kernel (weights stream before its wait).
    first_only: measurement only, q_a|kv_a's units alone (qb_parts not written).
    dump: testing only, fp32 [M, NQ]: q_b's B operand (c_q normed and quantized), dequantized.
    trace: measurement only, int64 [TRACE_WORKERS, len(TRACE_POINTS)] (TRACE_POINTS).
    late_q_b: q_b's weights asked for after q_a|kv_a's (AttnSide.late_q_b).
    fixed: q_a|kv_a reduced in fixed point, no tails (AttnSide.fixed; 1..FIXED_MAX_ROWS rows;
    work from ``workspace`` of that form); it writes each row's KV-cache row rather than
    kv_parts (not written): kv_norm bf16 [NKV - ROPE], positions int64 [M] (-1: a pad row),
    token_slots int32 [M, >= max position + 1] (row m's cache slot of each position), inv_freq
    fp32 [ROPE / 2], kv_cache bf16 [slots, NKV], as ``mla.latent`` takes them; or, with
    slot_rows int64 [M], token_slots int32 or int64 [R, W] is a pool's table (upstream's
    req_to_token, read in place) whose row slot_rows[m] is row m's. kv_parts may be None
    there (work.kv_stub stands in). early_dependents: with pdl, the next kernel may launch as
    this one starts (AttnSide.early_dependents). early_slots: with pdl, the weight slots each
    worker asks for before its wait (None: its ring's first lap; AttnSide.lap).
    norm_in: the fixed form with the layer's input add + RMSNorm folded in
    (AttnSide.norm_in): (hidden, residual, weight, residual_out), bf16 [M, K1], [M, K1],
    [K1], [M, K1]; x is made from hidden + residual in the launch (xq and sx are then never
    read: any e4m3 [>= x_rows(M), K1] and fp32 [M, K1/128] stand in), residual_out gets
    bf16(hidden + residual) and must not overlap residual (other units still read it)."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack, make_ptr

    m, nq = q_rows.shape
    shape = Shape(nq, wkv.shape[0], wq.shape[1], wb.shape[0])
    if kv_parts is None:
        if not fixed or work.kv_stub is None:
            raise ValueError("attn_side: kv_parts may be None only in the fixed form, with a "
                             "workspace of that form")
        kv_parts = work.kv_stub
    if slot_rows is not None and not fixed:
        raise ValueError("attn_side: slot_rows is the fixed form's (it writes the cache rows)")
    table_bits = 64 if fixed and token_slots is not None and token_slots.dtype == torch.int64 \
        else 32
    # the form's derived sizes (and its refusals) before anything is compiled
    options = (kv_parts.shape[0], qb_parts.shape[0], eps, GROUPS, pdl, first_only,
               dump is not None, trace is not None, late_q_b, fixed, slot_rows is not None,
               table_bits, early_dependents, early_slots, norm_in is not None)
    side = AttnSide(m, shape, *options[:-4], early_dependents=early_dependents,
                    early_slots=early_slots, norm_in=norm_in is not None)
    nx, (_, nkv, k1, nb) = side.nx, shape
    if xq.shape[0] < nx:
        raise ValueError(f"attn_side: xq needs at least {nx} rows for {m}, got {xq.shape[0]}")
    xq = xq[:nx]
    f32, e4m3 = torch.float32, torch.float8_e4m3fn
    for name, t, shp, dt in (
            ("xq", xq, (nx, k1), e4m3), ("sx", sx, (m, k1 // 128), f32),
            ("wq", wq, (nq, k1), e4m3), ("wsq", wsq, (nq // 128, k1 // 128), f32),
            ("wkv", wkv, (nkv, k1), e4m3), ("wskv", wskv, (-(-nkv // 128), k1 // 128), f32),
            ("gamma", gamma, (nq,), torch.bfloat16), ("wb", wb, (nb, nq), e4m3),
            ("q_rows", q_rows, (m, nq), torch.bfloat16),
            ("wsb", wsb, (-(-nb // 128), nq // 128), f32),
            ("kv_parts", kv_parts, (side.split1, m, nkv), f32),
            ("qb_parts", qb_parts, (side.split2, m, nb), f32),
            ("q_parts", work.q_parts, (side.split1, m, nq), f32),
            ("ss", work.ss, (2 * side.tq, m), f32),
            ("arrivals", work.arrivals, (_counts(side),), torch.int32),
            ("sync", work.sync, (FLAGS + side.tq,), torch.int32)):
        _check(name, t, shp, dt)
    acc = work.acc if work.acc is not None else _no_acc(q_rows.device)
    _check("acc", acc, _acc_shape(side), torch.int64)
    kv = (kv_norm, positions, token_slots, inv_freq, kv_cache)
    if fixed:
        names = ("kv_norm", "positions", "token_slots", "inv_freq", "kv_cache")
        missing = [n for n, v in zip(names, kv) if v is None]
        if missing:
            raise ValueError(f"attn_side: the fixed form writes the KV-cache rows: pass {missing}")
        _check("kv_norm", kv_norm, (side.kv_c,), torch.bfloat16)
        _check("positions", positions, (m,), torch.int64)
        table_rows = "R" if slot_rows is not None else m
        if token_slots.dtype not in (torch.int32, torch.int64) or token_slots.dim() != 2 or \
                (slot_rows is None and token_slots.shape[0] != m) or token_slots.stride(1) != 1:
            raise ValueError(f"attn_side: token_slots must be int32 or int64 [{table_rows}, W] "
                             f"with rows contiguous, got {token_slots.dtype} "
                             f"{tuple(token_slots.shape)}")
        if slot_rows is not None:
            _check("slot_rows", slot_rows, (m,), torch.int64)
        _check("inv_freq", inv_freq, (ROPE // 2,), f32)
        if kv_cache.dtype != torch.bfloat16 or kv_cache.dim() != 2 or \
                kv_cache.shape[1] != nkv or not kv_cache.is_contiguous():
            raise ValueError(f"attn_side: kv_cache must be a contiguous bf16 [slots, {nkv}], "
                             f"got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    else:
        kv = (gamma, sx, sx, sx, gamma)  # never read: stand-ins for the pointers
    # the pool table's rows (never read without slot_rows: positions stands in)
    kv = kv + (slot_rows if slot_rows is not None else kv[1],)
    if norm_in is not None:
        hidden, residual, weight, residual_out = norm_in
        bf16 = torch.bfloat16
        for name, t, shp in (("hidden", hidden, (m, k1)), ("residual", residual, (m, k1)),
                             ("norm weight", weight, (k1,)),
                             ("residual_out", residual_out, (m, k1))):
            _check(name, t, shp, bf16)
        lo, hi = residual.data_ptr(), residual.data_ptr() + residual.numel() * 2
        out = residual_out.data_ptr()
        if out < hi and lo < out + residual_out.numel() * 2:
            raise ValueError("attn_side: norm_in's residual_out overlaps the residual it reads "
                             "(other units still read it as tile 0's write it)")
        if work.ss_in is None or tuple(work.ss_in.shape) != (side.split1 * m,):
            raise ValueError("attn_side: norm_in needs a workspace of the fixed form (ss_in)")
        fold = (hidden, residual, weight, residual_out, work.ss_in)
    else:
        fold = (gamma,) * 4 + (sx,)  # never read: stand-ins for the pointers
    if dump is not None:
        _check("dump", dump, (m, nq), f32)
    if trace is not None:
        _check("trace", trace, (TRACE_WORKERS, len(TRACE_POINTS)), torch.int64)
    else:
        trace = _untraced(q_rows.device)
    sms = torch.cuda.get_device_properties(q_rows.device).multi_processor_count
    if grid > sms:
        raise ValueError(f"attn_side: grid {grid} > the {sms} SMs: its waits need every CTA "
                         "resident at once")
    _, fn = compiled(m, shape, *options)
    grid = grid or sms
    stream = cuda.CUstream(torch.cuda.current_stream(q_rows.device).cuda_stream)
    gmem = cute.AddressSpace.gmem
    fn(*(from_dlpack(t, assumed_align=16) for t in (
        xq, sx, wq, wsq, wkv, wskv, gamma, wb, wsb, kv_parts, work.q_parts, q_rows, qb_parts,
        work.ss, work.arrivals, work.sync, acc, dump if dump is not None else work.q_parts[0],
        trace)),
       *(make_ptr(dt, t.data_ptr(), gmem, align)
         for (dt, align), t in zip(_kv_ptrs(table_bits) + _NORM_IN_PTRS, kv + fold)),
       token_slots.stride(0) if fixed else 1, grid, stream)


@functools.lru_cache(maxsize=None)
def _no_acc(device):
    """The acc argument of a launch without the fixed form (never read)."""
    import torch
    return torch.zeros(1, 1, 1, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=None)
def _untraced(device):
    """The trace argument of a launch without it (never written; made once, outside any
    graph capture)."""
    import torch
    return torch.zeros(TRACE_WORKERS, len(TRACE_POINTS), dtype=torch.int64, device=device)
