"""Exact top-k of the indexer scores over long rows as one launch (CuTe DSL, sm_90): a thread
block cluster a row, whose CTAs meet in distributed shared memory between radix passes.

The Triton split top-k (``triton/topk.py``) cuts a row into 2048-score chunks and runs its four
radix passes and the write as six launches: ~4-5 us a pass is the hop between launches (or
between programs meeting at counters in global memory), and one program a row is no way out,
as Triton's histogram costs ~7 us a pass over 8K keys on one multiprocessor
(``topk.ONE_LAUNCH``'s note). Here a row is one cluster of CLUSTER CTAs, each taking an
equal consecutive range of the row's context as keys (the order-preserving int32 image of the
fp32 scores), spread evenly over its threads and loaded VEC at a time where the rows are
16-byte aligned: in registers from one load where a thread's share fits (contexts up to 64K,
in a table of any width; each pass the thread counts its share's key groups and branches past
the rest, SKIP, or, SIZED, walks the smallest of 4, 8, 16 or 32 keys that holds it), else, in
a wider table, loaded again each pass a tile of THREADS x keys_per_thread at a time, the next
tile's loads in flight while one is counted (PREFETCH, up to PREFETCH_ROWS rows). A wide
table's row takes 16 CTAs up to WIDE_CLUSTER_ROWS rows (the first 8 alone where its context
fits theirs), and the passes run as a loop (half the code) where the prefetch runs and up to
ROLL_ROWS rows (``launch_form``). Each pass is
  1. every CTA's 256-bin histogram of the next 8 bits of its keys that share the digits found
     so far (shared-memory atomics, two buffers used in turn),
  2. every CTA sending it into the others' shared memory (st.async, 32 bytes a thread), each
     waiting on its own mbarrier for the others' (PUSH; or, pulled, a cluster barrier and
     each CTA reading the others' from their shared memory: each such barrier is a
     MEMBAR.ALL.GPU and an L1 invalidation),
  3. each CTA summing the cluster's histograms bin by bin (so every CTA finds the same digit
     of the k-th largest key, and how many keys at it are still needed),
then the write: each thread counts its keys above the k-th and its ties, scans over the CTA
(tile by tile) and the counts of the CTAs before it (sent the same way) place them, and it
stores the positions of its keys above and of the ties the lowest positions take first (a
stable descending sort's choice), ascending, as
``topk.topk_positions``: output int64 [M, k], -1 padded where a row's context (positions[m]
+ 1) fits in k, whose positions it takes whole. Rows may be pads (position -1: every entry -1).
"""

from __future__ import annotations

import functools
import logging

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm, nvvm, vector
from cutlass.cutlass_dsl import T, dsl_user_op

logger = logging.getLogger(__name__)

THREADS = 256  # a CTA's threads; BINS of them own a histogram bin each
BINS = 256  # 8-bit digits: four passes
CLUSTER = 8  # CTAs a row (the portable cluster size)
MAX_KEYS_PER_THREAD = 32  # registers a thread holds keys in: contexts up to 64K scores
VEC = 4  # keys a vector load brings (a thread's keys are VEC-aligned runs of the row)
WARPS = THREADS // 32  # as many as CLUSTER: warp w sends this CTA's histogram to CTA w
SIGN = -2147483648  # 0x80000000 as an int32
# the CTAs send their histograms and counts to each other (st.async onto mbarriers) rather
# than read them after cluster barriers (each a MEMBAR.ALL.GPU and an L1 invalidation)
PUSH = True
# a wide table's context past 64K: each tile's successor loaded while the tile is counted
# (two tiles of registers a thread), rather than each tile loaded when its turn comes
PREFETCH = True
# ... for up to this many rows, and no more than the GPU holds clusters of CLUSTER at once at
# one CTA an SM (``launch_form``; an H100 holds 15): the prefetching form takes 171 registers a
# thread, so an SM holds one of its CTAs, and 16 rows' clusters no longer all fit at once on
# an H100 (alone at 128K: 46.8 us against 37.6 without at 16 rows; the MoE+indexer layer at
# 16 rows 4-17 us slower at 8K-128K, before ROLL). Rolled, up to 15 rows against up to 8 (H100,
# 0d214db, the layer in a 1M table): -10.5..-11.5 us at 9 rows of 128K, -9.5..-9.9 at 12,
# -11.3..-11.4 at 13, -12.1 at 15; -0.4..-1.6 at 9 and 13 rows of 32K; within 0.7 at 12 and
# 15 rows of 8K (results/tiling_probe_20261206T103233Z, T103316Z, T103502Z, T103528Z:
# topk_prefetch_15; unrolled, topk_prefetch_15_unrolled, half that)
PREFETCH_ROWS = 15
# the rows of an unknown GPU's launch (the occupancy query failed) that take the prefetching
# form: those first measured on an H100
PREFETCH_ROWS_UNQUERIED = 8
# off: a context held in registers walks every key a thread holds (32 in a wide table). On,
# it walks the smallest of HELD_SIZES and 32 that holds its share, one compiled path each: in
# the MoE+indexer layer (1M-wide table, H100) that was 3.5 us faster at 8K and 16K contexts
# but 4-5 us slower at 32K and 128K (its n=32 path and reloading path the same code, in a
# kernel with more of it; not so alone, where the code stays cached)
SIZED = False
HELD_SIZES = (4, 8, 16)
# a thread's count each pass branches past its key groups (VEC keys) that start at or after
# its share's end, rather than walking them predicated off: one code path, a short context in
# a wide table counting what it holds (what SIZED bought at 8K, without its code)
SKIP = True
# ... in a held context's tally and write too (off: they walk every key a thread holds,
# predicated off past its share)
SKIP_WRITE = True
# ... in a reloaded context's count too (only its last tile ends inside a thread's keys)
SKIP_RELOADED = False
# CTAs a row of a table wider than CLUSTER holds at once (64K), at up to WIDE_CLUSTER_ROWS
# rows: 16 (a non-portable cluster size; an H100 holds 7 such clusters at one CTA an SM)
# holds contexts up to 128K in registers and reloads half the tiles a CTA past that, while a
# context up to 64K is taken by the first 8 alone (the others leave at once), each pass's
# exchange among 8; CLUSTER (8): off. With all 16 for every context (H100, the MoE+indexer
# layer, 1M table, 1 / 4 rows): 94.0 / 151.0 us at 128K against 105.1 / 162.7 with 8, but
# 80.0 / 125.0 at 8K against 77.7 / 122.9 (results/tiling_probe_20261206T0749*-T0750*); with
# the first 8 alone up to 64K: 93.6 / 151.6 at 128K against 104.3 / 163.0, 78.2 / 123.4 at
# 8K against 77.7 / 123.2 (tiling_probe_20261206T080350Z, T080437Z). Only where the GPU holds
# that many clusters of 16 at once (``clusters_resident``), else 8. As the default (at 1d3a44c,
# the query and ``prepare`` on the GPU): 93.6-93.8 / 150.7-151.1 us at 128K against 104.3 /
# 162.1-162.2 with 8 (tiling_probe_20261206T101012Z, topk_cluster8).
WIDE_CLUSTER = 2 * CLUSTER
WIDE_CLUSTER_ROWS = 7
# the four radix passes as a loop rather than unrolled (half the kernel's code: the layer at
# one row of 128K 104.9-105.6 us against 114.5, 162.2 against 169.2 at 4 rows, 8K-32K the
# same within 0.5; results/tiling_probe_20261206T074557Z), at up to ROLL_ROWS rows
ROLL = True
# ... and wherever the prefetching form runs (one CTA an SM anyway, 171 registers). Up to
# ROLL_ROWS rows the rolled form runs without the prefetch too (narrower tables); where the
# rows' clusters then do not all fit at one CTA an SM it asks for two (128 registers a thread,
# 8 bytes spilled, once a row). Not faster there (H100, at 1d3a44c, ROLL_ROWS 16): alone at 12 /
# 16 rows of 128K 29.1 / 37.7 us against 27.8 / 37.5 unrolled (results/topk_probe_20261206T100907Z,
# cluster_rolled_16); the MoE+indexer layer at 16 rows +0.7..+2.7 us at 128K, within 1.4 at 8K
# and 32K (tiling_probe_20261206T100915Z, T100947Z, T101012Z: topk_rolled_16). Up to 15 rows
# (one CTA an SM where the GPU holds 15 clusters of 8) against up to 8, a context held whole in
# a table up to 64K wide (H100, at 46530a5, the MoE+indexer layer, two pairs): 64K at 12 / 15
# rows -1.7..-2.4 / -1.7..-2.2 us, 8K within +-0.4 (results/tiling_probe_20261206T124857Z,
# T124913Z: topk_rolled_15). Where the occupancy query fails (PREFETCH_ROWS_UNQUERIED, 8), held
# rows 9-15 take the rolled form at two CTAs an SM, timed only as topk_rolled_16 above.
ROLL_ROWS = 15
# measurement only (``trace``): each CTA's %globaltimer (ns) at these points of a row, into
# trace int64 [rows x cluster_size, len(TRACE_POINTS)]; for a context loaded again each pass,
# "loaded" is its first pass's tiles loaded and counted
TRACE_POINTS = ("start", "loaded", "pass 0", "pass 1", "pass 2", "pass 3", "counts seen",
                "written")


@dsl_user_op
def _load_remote(smem_ptr: cute.Pointer, rank, *, loc=None, ip=None) -> cutlass.Int32:
    """The int32 at `smem_ptr` in the shared memory of the cluster's CTA `rank`
    (mapa, then ld.shared::cluster)."""
    remote = nvvm.mapa(llvm.PointerType.get(7), smem_ptr.to_llvm_ptr(loc=loc, ip=ip),
                       cutlass.Int32(rank).ir_value(loc=loc, ip=ip), loc=loc, ip=ip)
    addr = llvm.ptrtoint(T.i32(), remote, loc=loc, ip=ip)
    shared = llvm.inttoptr(llvm.PointerType.get(3), addr, loc=loc, ip=ip)
    return cute.arch.load(shared, cutlass.Int32, ss="cluster", loc=loc, ip=ip)


@dsl_user_op
def _load_vec(ptr: cute.Pointer, *, loc=None, ip=None) -> list:
    """VEC int32 from global memory at `ptr` (VEC x 4 bytes aligned) as one vector load."""
    vec = cute.arch.load(ptr, ir.VectorType.get([VEC], T.i32()), loc=loc, ip=ip)
    return [cutlass.Int32(llvm.extractelement(vec, cutlass.Int32(e).ir_value(loc=loc, ip=ip),
                                              loc=loc, ip=ip)) for e in range(VEC)]


@dsl_user_op
def _push(smem_ptr: cute.Pointer, values: tuple, mbar_ptr: cute.Pointer, rank, *, loc=None,
          ip=None) -> None:
    """st.async of `values` (2 or 4 int32, as aligned) to `smem_ptr`'s offset in the shared
    memory of the cluster's CTA `rank`, completing their bytes on its mbarrier at `mbar_ptr`'s
    offset (no fence, no barrier: the receiver's wait on that mbarrier sees them)."""
    dsmem = llvm.PointerType.get(7)
    r = cutlass.Int32(rank).ir_value(loc=loc, ip=ip)
    dst = nvvm.mapa(dsmem, smem_ptr.to_llvm_ptr(loc=loc, ip=ip), r, loc=loc, ip=ip)
    bar = nvvm.mapa(dsmem, mbar_ptr.to_llvm_ptr(loc=loc, ip=ip), r, loc=loc, ip=ip)
    vals = [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in values]
    vec = vector.from_elements(ir.VectorType.get([len(vals)], T.i32()), vals, loc=loc, ip=ip)
    nvvm.store_async(dst, vec, bar, loc=loc, ip=ip)


def _round_up(x, n: int):
    return (x + (n - 1)) // n * n


def _digit_bits(p):
    """(shift, high) of radix pass p's digit: its bits are (u >> shift) & 0xFF of a key's
    unsigned image u, and the bits above it `high` (None at pass 0: none). p: an int, or
    (ROLL) an Int32, whose pass 0 masks with 0 (-256 << 24 wraps to 0)."""
    if isinstance(p, int):
        return 24 - 8 * p, (-(1 << (32 - 8 * p)) if p > 0 else None)
    return 24 - 8 * p, cutlass.Int32(-256) << (24 - 8 * p)


class ClusterTopk:
    """One compiled form: the top-k of rows of up to cluster x THREADS x kpt scores held in
    registers (wide: longer rows too, their keys loaded again each pass)."""

    def __init__(self, k: int, kpt: int, pdl: bool = False, wide: bool = False,
                 vec: bool = True, push: bool = True, trace: bool = False,
                 prefetch: bool = True, sizes: tuple = (), skip: bool = True,
                 skip_write: bool = False, skip_reloaded: bool = True,
                 cluster: int = CLUSTER, roll: bool = False, ctas_per_sm: int = 1):
        if not 1 <= kpt <= MAX_KEYS_PER_THREAD or kpt % VEC:
            raise ValueError(f"cluster_topk: a multiple of {VEC} up to {MAX_KEYS_PER_THREAD} "
                             f"keys a thread, got {kpt}")
        if cluster not in (CLUSTER, 2 * CLUSTER):
            raise ValueError(f"cluster_topk: {CLUSTER} or {2 * CLUSTER} CTAs a row, got "
                             f"{cluster}")
        # wide: rows may be longer than the cluster's keys (loaded again each pass); vec: the
        # row's keys come VEC at a time (its start 16-byte aligned, its width and stride VEC's
        # multiples)
        self.k, self.kpt, self.pdl, self.wide, self.vec = k, kpt, pdl, wide, vec
        # push: each CTA sends its histograms and counts into the others' shared memory
        # (st.async, each receiver waiting on its own mbarrier); else each CTA reads the
        # others' after a cluster barrier
        self.push = push
        # prefetch (wide): a context loaded again each pass has its next tile's loads in
        # flight while a tile's keys are counted
        self.prefetch = prefetch
        # sizes: the smaller key counts a thread's row may hold besides kpt, one compiled
        # path each (``held_sizes``)
        self.sizes = tuple(sizes)
        # skip: each pass's count stops at the thread's last key group (``_keys``); in a
        # held context's tally and write too (skip_write), in a reloaded one's count
        # (skip_reloaded)
        self.skip = skip
        self.skip_write = skip and skip_write
        self.skip_reloaded = skip and skip_reloaded
        # CTAs a row (warp w sends this CTA's histogram to CTAs w, w + WARPS, ...)
        self.cluster = cluster
        # roll: the four passes a loop (the digit's shift and mask computed) rather than
        # unrolled
        self.roll = roll
        # CTAs an SM the launch leaves room for (the registers a thread may take: 2, 128)
        self.ctas_per_sm = ctas_per_sm
        # measurement only: each CTA's %globaltimer at TRACE_POINTS
        self.trace = trace
        self.chunk = THREADS * kpt
        self.width = cluster * self.chunk

    @cute.jit
    def __call__(self, scores: cute.Pointer, positions: cute.Pointer, out: cute.Pointer,
                 trace: cute.Pointer, rows: cutlass.Int32, stride: cutlass.Int32,
                 width: cutlass.Int32, stream):
        @cute.struct
        class Storage:
            hist: cute.struct.MemRange[cutlass.Int32, 2 * BINS]
            total: cute.struct.MemRange[cutlass.Int32, BINS]
            warp: cute.struct.MemRange[cutlass.Int32, WARPS]
            # the digit found, keys still needed at it, this CTA's keys above its bin and in it
            state: cute.struct.MemRange[cutlass.Int32, 4]
            # [above, ties]: this CTA's (pull) or, push, every CTA's before this one
            count: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, 2 * self.cluster],
                                     16]
            # push: the other CTAs' histograms, each pass its own [cluster, BINS], and an
            # mbarrier a pass and one for the counts
            gather: cute.struct.Align[cute.struct.MemRange[
                cutlass.Int32, 4 * self.cluster * BINS if self.push else 4], 16]
            bars: cute.struct.MemRange[cutlass.Int64, 5]

        self.storage = Storage
        self.kernel(scores, positions, out, trace, stride, width).launch(
            grid=[rows * self.cluster, 1, 1], block=[THREADS, 1, 1],
            cluster=[self.cluster, 1, 1],
            smem=Storage.size_in_bytes(), stream=stream, use_pdl=self.pdl,
            # one CTA an SM: registers for every key (no spill); two: at most 128 a thread, and
            # the shared memory carveout that two CTAs need
            min_blocks_per_mp=self.ctas_per_sm,
            preferred_smem_carveout=100 if self.ctas_per_sm > 1 else None)

    @cute.jit
    def _block_scan(self, value, lane, w, warp_sums: cute.Tensor):
        """(exclusive prefix of `value` over the CTA's threads in order, the CTA's total)."""
        cute.arch.barrier()  # every thread has read the previous scan's warp sums
        x = value
        for i in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(x, 1 << i)
            if lane >= (1 << i):
                x = x + y
        if lane == 31:
            warp_sums[w] = x
        cute.arch.barrier()
        before = cutlass.Int32(0)
        total = cutlass.Int32(0)
        for i in cutlass.range_constexpr(WARPS):
            s = warp_sums[i]
            if i < w:
                before = before + s
            total = total + s
        return before + x - value, total

    @cute.jit
    def _digit(self, lane, total: cute.Tensor, state: cute.Tensor, need, hist: cute.Tensor,
               buf, tally: cutlass.Constexpr):
        """Warp 0: the highest bin whose keys and those of the bins above it number at least
        `need` (the next digit of the k-th largest key) into state[0], and `need` less the keys
        above that bin into state[1]; each lane holds 8 bins. tally: this CTA's keys in the
        bins above it (hist[buf:], its own histogram) into state[2], and in it into state[3]."""
        per = BINS // 32
        own = cute.make_rmem_tensor(cute.make_layout(per), cutlass.Int32)
        s = cutlass.Int32(0)
        for i in cutlass.range_constexpr(per):
            own[i] = total[lane * per + i]
            s = s + own[i]
        at_or_above = s  # this lane's bins and every higher lane's
        for i in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_down(at_or_above, 1 << i)
            if lane + (1 << i) < 32:
                at_or_above = at_or_above + y
        run = at_or_above - s  # keys in the bins above this lane's
        best = cutlass.Int32(-1)
        above_best = cutlass.Int32(0)
        for i in cutlass.range_constexpr(per - 1, -1, -1):
            if best < 0 and run + own[i] >= need:
                best = lane * per + i
                above_best = run
            run = run + own[i]
        digit = best
        for i in cutlass.range_constexpr(5):
            digit = cutlass.max(digit, cute.arch.shuffle_sync_bfly(digit, 1 << i))
        if best == digit:
            state[0] = digit
            state[1] = need - above_best
        if cutlass.const_expr(tally):
            mine = cutlass.Int32(0)
            for i in cutlass.range_constexpr(per):
                if lane * per + i > digit:
                    mine = mine + hist[buf + lane * per + i]
            for i in cutlass.range_constexpr(5):
                mine = mine + cute.arch.shuffle_sync_bfly(mine, 1 << i)
            if lane == 0:
                state[2] = mine
                state[3] = hist[buf + digit]

    @cute.jit
    def _mark(self, trace: cute.Pointer, cta, t, point):
        if cutlass.const_expr(self.trace):
            if t == 0:
                marks = cute.make_tensor(trace + cta * len(TRACE_POINTS),
                                         cute.make_layout(len(TRACE_POINTS)))
                marks[point] = cute.arch.globaltimer().to(cutlass.Int64)

    @cute.jit
    def _fetch(self, row: cute.Tensor, first, limit, raw: cute.Tensor, n: cutlass.Constexpr):
        """The fp32 bits at positions first .. first + n - 1 into raw (0 past `limit`, or in
        vector form whatever the row holds there, which no later step reads)."""
        if cutlass.const_expr(self.vec):
            for g in cutlass.range_constexpr(n // VEC):
                for e in cutlass.range_constexpr(VEC):
                    raw[g * VEC + e] = cutlass.Int32(0)
                if first + g * VEC < limit:
                    v = _load_vec(row.iterator + (first + g * VEC))
                    for e in cutlass.range_constexpr(VEC):
                        raw[g * VEC + e] = v[e]
        else:
            for j in cutlass.range_constexpr(n):
                bits = cutlass.Int32(0)
                if first + j < limit:
                    bits = row[first + j]
                raw[j] = bits

    @cute.jit
    def _image(self, raw: cute.Tensor, keys: cute.Tensor, n: cutlass.Constexpr):
        """keys = the order-preserving int32 image of the fp32 bits in raw (signed compare;
        ^ SIGN gives the unsigned bits); raw and keys may be the same."""
        for j in cutlass.range_constexpr(n):
            bits = raw[j]
            keys[j] = bits ^ ((bits >> 31) & 0x7FFFFFFF)

    @cute.jit
    def _load(self, row: cute.Tensor, first, limit, keys: cute.Tensor, n: cutlass.Constexpr):
        """The keys at positions first .. first + n - 1 (``_fetch``, then ``_image``)."""
        self._fetch(row, first, limit, keys, n)
        self._image(keys, keys, n)

    @cute.jit
    def _keys(self, step: cutlass.Constexpr, state, first, limit, g: cutlass.Constexpr,
              n: cutlass.Constexpr, skip: cutlass.Constexpr):
        """state = step(*state, j) for this thread's keys j = g * VEC .. n - 1; skip: a branch
        past the key groups (VEC keys) that start at or after `limit` (a short context's
        thread does its share, not every key it could hold)."""
        for e in cutlass.range_constexpr(VEC if skip else n):
            state = step(*state, g * VEC + e)
        if cutlass.const_expr(skip and (g + 1) * VEC < n):
            if first + (g + 1) * VEC < limit:
                state = self._keys(step, state, first, limit, g + 1, n, skip)
        return state

    @cute.jit
    def _count(self, keys: cute.Tensor, first, limit, hist: cute.Tensor, buf, found, p,
               n: cutlass.Constexpr, skip: cutlass.Constexpr):
        """Digit p's histogram (into hist[buf:]) of the keys sharing the digits found so far;
        skip: as ``_keys``."""
        shift, high = _digit_bits(p)
        step = functools.partial(self._count_key, keys, first, limit, hist, buf, found, shift,
                                 high)
        self._keys(step, (), first, limit, 0, n, skip)

    @cute.jit
    def _count_key(self, keys: cute.Tensor, first, limit, hist: cute.Tensor, buf, found,
                   shift, high, j: cutlass.Constexpr):
        u = keys[j] ^ SIGN
        match = first + j < limit
        if cutlass.const_expr(high is not None):
            match = match & ((u & high) == found)
        if match:
            cute.arch.atomic_add(hist.iterator + (buf + ((u >> shift) & 0xFF)),
                                 cutlass.Int32(1), sem="relaxed", scope="cta")
        return ()

    @cute.jit
    def _pass_end(self, hist: cute.Tensor, total: cute.Tensor, state: cute.Tensor, need, p,
                  t, lane, w, c, active, gather: cute.Tensor, bars,
                  tally: cutlass.Constexpr = False):
        """After this CTA's histogram of digit p (an int unrolled, an Int32 rolled): the
        cluster's, summed from the shared memory of its first `active` CTAs (those taking
        part in the row), and the digit with the keys still needed at it (the same in every
        CTA); tally: also this CTA's keys above that digit's bin and in it (``_digit``)."""
        buf = (p % 2) * BINS
        got = cutlass.Int32(0)
        if cutlass.const_expr(self.push):
            if t == 0:  # the other CTAs' histograms, 4 bytes a bin
                cute.arch.mbarrier_arrive_and_expect_tx(bars + p, (active - 1) * BINS * 4)
            cute.arch.barrier()  # this CTA's histogram whole
            if cutlass.const_expr(self.roll):
                if p == 0:
                    cute.arch.cluster_wait()  # every CTA's mbarriers initialized
            else:
                if cutlass.const_expr(p == 0):
                    cute.arch.cluster_wait()
            # warp w sends bins 8 x lane .. + 7 to CTAs w, w + WARPS, ... (not to itself)
            for q in cutlass.range_constexpr(self.cluster // WARPS):
                if self._takes_part(w + q * WARPS, c, active, q * WARPS):
                    b = lane * (BINS // 32)
                    at = gather.iterator + ((p * self.cluster + c) * BINS + b)
                    for h in cutlass.range_constexpr(BINS // 32 // VEC):
                        _push(at + h * VEC,
                              tuple(hist[buf + b + h * VEC + e] for e in range(VEC)),
                              bars + p, w + q * WARPS)
            cute.arch.mbarrier_wait(bars + p, 0)
            got = hist[buf + t]
            for r in cutlass.range_constexpr(self.cluster):
                if self._takes_part(r, c, active, r):
                    got = got + gather[(p * self.cluster + r) * BINS + t]
        else:
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            for r in cutlass.range_constexpr(self.cluster):
                got = got + _load_remote(hist.iterator + (buf + t), r)
        total[t] = got
        # the other buffer was read by every CTA in the pass before this barrier
        hist[((p + 1) % 2) * BINS + t] = cutlass.Int32(0)
        cute.arch.barrier()
        if w == 0:
            self._digit(lane, total, state, need, hist, buf, tally)
        cute.arch.barrier()
        if cutlass.const_expr(tally):
            return state[0], state[1], state[2], state[3]
        return state[0], state[1]

    @cute.jit
    def _tally(self, keys: cute.Tensor, first, limit, kth, n: cutlass.Constexpr,
               skip: cutlass.Constexpr = False):
        """(keys above the k-th, keys equal to it) among this thread's; skip: as ``_keys``."""
        step = functools.partial(self._tally_key, keys, first, limit, kth)
        return self._keys(step, (cutlass.Int32(0), cutlass.Int32(0)), first, limit, 0, n, skip)

    @cute.jit
    def _tally_key(self, keys: cute.Tensor, first, limit, kth, above, ties,
                   j: cutlass.Constexpr):
        if first + j < limit:
            if keys[j] > kth:
                above = above + 1
            if keys[j] == kth:
                ties = ties + 1
        return above, ties

    @cute.jit
    def _write(self, keys: cute.Tensor, first, limit, kth, need, tie_rank, at,
               out_row: cute.Tensor, n: cutlass.Constexpr, skip: cutlass.Constexpr = False):
        """This thread's keys above the k-th and its ties of rank below `need`, at `at` on;
        skip: as ``_keys``."""
        step = functools.partial(self._write_key, keys, first, limit, kth, need, out_row)
        self._keys(step, (tie_rank, at), first, limit, 0, n, skip)

    @cute.jit
    def _write_key(self, keys: cute.Tensor, first, limit, kth, need, out_row: cute.Tensor,
                   tie_rank, at, j: cutlass.Constexpr):
        if first + j < limit:
            take = keys[j] > kth
            if keys[j] == kth:
                take = tie_rank < need
                tie_rank = tie_rank + 1
            if take:
                out_row[at] = cutlass.Int64(first + j)
                at = at + 1
        return tie_rank, at

    @cute.jit
    def _exchange(self, count: cute.Tensor, above, ties, t, c, active, need, bars):
        """(entries the CTAs before c write, ties they hold), from each CTA's [above, ties]
        of the cluster's (this CTA's: `above`, `ties`, in thread 0)."""
        if cutlass.const_expr(self.push):
            if t == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(bars + 4, 8 * c)
                for r in cutlass.range_constexpr(1, self.cluster):
                    if self._takes_part(r, c, active, r, after=True):
                        _push(count.iterator + 2 * c, (above, ties), bars + 4, r)
            cute.arch.mbarrier_wait(bars + 4, 0)
        else:
            if t == 0:
                count[0] = above
                count[1] = ties
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        taken = cutlass.Int32(0)
        tied = cutlass.Int32(0)
        for r in cutlass.range_constexpr(self.cluster - 1):
            if r < c:
                if cutlass.const_expr(self.push):
                    their_above = count[2 * r]
                    their_ties = count[2 * r + 1]
                else:
                    their_above = _load_remote(count.iterator, r)
                    their_ties = _load_remote(count.iterator + 1, r)
                taken = taken + their_above + cutlass.min(their_ties,
                                                          cutlass.max(need - tied, 0))
                tied = tied + their_ties
        return taken, tied

    @cute.jit
    def _takes_part(self, r, c, active, least: cutlass.Constexpr,
                    after: cutlass.Constexpr = False):
        """Whether CTA r (at least `least`) is another CTA that takes part in the row (after:
        one after c): r < active is known true below CLUSTER."""
        other = r != c
        if cutlass.const_expr(after):
            other = r > c
        if cutlass.const_expr(least >= CLUSTER):
            other = other & (r < active)
        return other

    def held_sizes(self) -> tuple:
        """Keys a thread holds, one compiled path each (those of `sizes` below kpt, then
        kpt): a row's context takes the smallest that holds its share."""
        return tuple(sorted(n for n in set(self.sizes) if n < self.kpt)) + (self.kpt,)

    @cute.jit
    def _held(self, n: cutlass.Constexpr, row: cute.Tensor, first, end, out_row: cute.Tensor,
              hist: cute.Tensor, total: cute.Tensor, state: cute.Tensor,
              warp_sums: cute.Tensor, count: cute.Tensor, gather: cute.Tensor, bars, trace,
              cta, t, lane, w, c, active):
        """A row whose context this thread holds at once: its keys at first .. end - 1 (up to
        n) loaded, the four passes, the counts exchanged, its entries written."""
        keys = cute.make_rmem_tensor(cute.make_layout(n), cutlass.Int32)
        found = cutlass.Int32(0)  # the digits found so far, in place (unsigned image)
        need = cutlass.Int32(self.k)
        self._mark(trace, cta, t, 0)
        self._load(row, first, end, keys, n)
        self._mark(trace, cta, t, 1)
        if cutlass.const_expr(self.roll):
            for p in cutlass.range(4, unroll=1):
                found, need = self._held_pass(p, n, keys, first, end, found, need, hist, total,
                                              state, gather, bars, trace, cta, t, lane, w, c,
                                              active)
        else:
            for p in cutlass.range_constexpr(4):
                found, need = self._held_pass(p, n, keys, first, end, found, need, hist, total,
                                              state, gather, bars, trace, cta, t, lane, w, c,
                                              active)
        kth = found ^ SIGN  # the k-th largest key, signed image
        above, ties = self._tally(keys, first, end, kth, n, self.skip_write)
        # a CTA holds at most 8K keys: above and ties packed in 16 bits each
        before, mine = self._block_scan((above << 16) | ties, lane, w, warp_sums)
        taken_before, ties_before = self._exchange(count, mine >> 16, mine & 0xFFFF,
                                                   t, c, active, need, bars)
        self._mark(trace, cta, t, 6)
        self._write(keys, first, end, kth, need, ties_before + (before & 0xFFFF),
                    taken_before + (before >> 16)
                    + cutlass.min(before & 0xFFFF, cutlass.max(need - ties_before, 0)),
                    out_row, n, self.skip_write)
        self._mark(trace, cta, t, 7)

    @cute.jit
    def _held_pass(self, p, n: cutlass.Constexpr, keys: cute.Tensor, first, end, found, need,
                   hist: cute.Tensor, total: cute.Tensor, state: cute.Tensor,
                   gather: cute.Tensor, bars, trace, cta, t, lane, w, c, active):
        """Radix pass p of a held context: (the digits found, keys still needed) after it."""
        self._count(keys, first, end, hist, (p % 2) * BINS, found, p, n, self.skip)
        digit, need = self._pass_end(hist, total, state, need, p, t, lane, w, c, active, gather,
                                     bars)
        self._mark(trace, cta, t, 2 + p)
        return found | (digit << (24 - 8 * p)), need

    @cute.jit
    def _reloaded_pass(self, p, row: cute.Tensor, keys: cute.Tensor, ahead: cute.Tensor,
                       first, hi, tiles, found, need, above, hist: cute.Tensor,
                       total: cute.Tensor, state: cute.Tensor, gather: cute.Tensor, bars,
                       trace, cta, t, lane, w, c, active):
        """Radix pass p of a context loaded again each pass, tile by tile: (the digits
        found, keys still needed, this CTA's keys above the k-th found so far, its keys in
        this pass's bin) after it."""
        for i in cutlass.range(tiles, unroll=1):
            at = first + i * self.chunk
            if cutlass.const_expr(self.prefetch):
                # this tile's keys, then the next tile's loads (this pass's next, or the first
                # again for the next pass or the write) in flight while this one's are counted
                self._image(ahead, keys, self.kpt)
                following = i + 1
                if following == tiles:
                    following = cutlass.Int32(0)
                self._fetch(row, first + following * self.chunk, hi, ahead, self.kpt)
            else:
                self._load(row, at, hi, keys, self.kpt)
            self._count(keys, at, hi, hist, (p % 2) * BINS, found, p, self.kpt,
                        self.skip_reloaded)
        if cutlass.const_expr(self.trace):
            if cutlass.const_expr(self.roll):
                if p == 0:
                    self._mark(trace, cta, t, 1)
            else:
                if cutlass.const_expr(p == 0):
                    self._mark(trace, cta, t, 1)
        digit, need, up, ties = self._pass_end(hist, total, state, need, p, t, lane, w, c,
                                               active, gather, bars, True)
        self._mark(trace, cta, t, 2 + p)
        return found | (digit << (24 - 8 * p)), need, above + up, ties

    @cute.jit
    def _row(self, scores: cute.Pointer, m, stride, width, limit, out_row: cute.Tensor,
             hist: cute.Tensor, total: cute.Tensor, state: cute.Tensor,
             warp_sums: cute.Tensor, count: cute.Tensor, gather: cute.Tensor, bars, trace, cta,
             t, lane, w, c, active):
        """Row m's top-k over its first `limit` scores (past k), split among the cluster's
        first `active` CTAs (CTA c < active)."""
        row = cute.make_tensor(scores + m * stride, cute.make_layout(width))
        # CTA c takes positions lo .. hi - 1, consecutive, multiples of VEC apart
        span = _round_up((limit + active - 1) // active, VEC)
        lo = c * span
        hi = cutlass.min(lo + span, limit)
        per = _round_up((span + THREADS - 1) // THREADS, VEC)  # a thread's, held at once
        cute.arch.barrier()  # the zeroed histograms before any atomic
        if cutlass.const_expr(not self.wide) or per <= self.kpt:  # keys from one load
            first = lo + t * per
            end = cutlass.min(first + per, hi)
            # the smallest of the compiled sizes that holds `per` keys: a short context
            # in a wide table walks only its own keys
            sizes = self.held_sizes()
            pick = cutlass.Int32(0)
            for i in cutlass.range_constexpr(len(sizes) - 1):
                if per > sizes[i]:
                    pick = pick + 1
            for i in cutlass.range_constexpr(len(sizes)):
                if pick == i:
                    self._held(sizes[i], row, first, end, out_row, hist, total, state,
                               warp_sums, count, gather, bars, trace, cta, t, lane, w, c, active)
        else:  # longer contexts: each pass loads the CTA's tiles again (from L2)
            tiles = (span + self.chunk - 1) // self.chunk
            keys = cute.make_rmem_tensor(cute.make_layout(self.kpt), cutlass.Int32)
            # prefetch: the next tile's raw bits, loaded while this one's are counted
            ahead = cute.make_rmem_tensor(cute.make_layout(self.kpt), cutlass.Int32)
            found = cutlass.Int32(0)  # the digits found so far, in place (unsigned image)
            need = cutlass.Int32(self.k)
            first = lo + t * self.kpt
            # this CTA's keys above the k-th: those above the digit's bin in each pass's
            # histogram (a key's first digit off the k-th's is a larger one); its ties:
            # those in the last pass's bin
            above = cutlass.Int32(0)
            ties = cutlass.Int32(0)
            self._mark(trace, cta, t, 0)
            if cutlass.const_expr(self.prefetch):
                self._fetch(row, first, hi, ahead, self.kpt)
            if cutlass.const_expr(self.roll):
                for p in cutlass.range(4, unroll=1):
                    found, need, above, ties = self._reloaded_pass(
                        p, row, keys, ahead, first, hi, tiles, found, need, above, hist,
                        total, state, gather, bars, trace, cta, t, lane, w, c, active)
            else:
                for p in cutlass.range_constexpr(4):
                    found, need, above, ties = self._reloaded_pass(
                        p, row, keys, ahead, first, hi, tiles, found, need, above, hist,
                        total, state, gather, bars, trace, cta, t, lane, w, c, active)
            kth = found ^ SIGN
            taken, tied = self._exchange(count, above, ties, t, c, active, need, bars)
            self._mark(trace, cta, t, 6)
            for i in cutlass.range(tiles, unroll=1):  # tile by tile, in position order
                at = first + i * self.chunk
                if cutlass.const_expr(self.prefetch):
                    self._image(ahead, keys, self.kpt)
                    more = hi
                    if i + 1 == tiles:
                        more = cutlass.Int32(0)  # no tile after the last
                    self._fetch(row, at + self.chunk, more, ahead, self.kpt)
                else:
                    self._load(row, at, hi, keys, self.kpt)
                a, e = self._tally(keys, at, hi, kth, self.kpt)
                a_before, a_all = self._block_scan(a, lane, w, warp_sums)
                e_before, e_all = self._block_scan(e, lane, w, warp_sums)
                self._write(keys, at, hi, kth, need, tied + e_before,
                            taken + a_before
                            + cutlass.min(e_before, cutlass.max(need - tied, 0)), out_row,
                            self.kpt)
                taken = taken + a_all + cutlass.min(e_all, cutlass.max(need - tied, 0))
                tied = tied + e_all
            self._mark(trace, cta, t, 7)

    @cute.kernel
    def kernel(self, scores: cute.Pointer, positions: cute.Pointer, out: cute.Pointer,
               trace: cute.Pointer, stride: cutlass.Int32, width: cutlass.Int32):
        t, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane = t % 32
        w = t // 32
        m = cta // self.cluster
        c = cta % self.cluster
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        hist = storage.hist.get_tensor(cute.make_layout(2 * BINS))
        total = storage.total.get_tensor(cute.make_layout(BINS))
        warp_sums = storage.warp.get_tensor(cute.make_layout(WARPS))
        state = storage.state.get_tensor(cute.make_layout(4))
        count = storage.count.get_tensor(cute.make_layout(2 * self.cluster))
        gather = storage.gather.get_tensor(cute.make_layout(4 * self.cluster * BINS))
        bars = storage.bars.data_ptr()
        hist[t] = cutlass.Int32(0)
        hist[t + BINS] = cutlass.Int32(0)
        if cutlass.const_expr(self.push):
            if t == 0:
                for i in cutlass.range_constexpr(5):
                    cute.arch.mbarrier_init(bars + i, 1)
                cute.arch.mbarrier_init_fence()
            # the first push waits for this: every CTA's mbarriers initialized
            cute.arch.cluster_arrive_relaxed()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        pos_t = cute.make_tensor(positions, cute.make_layout(m + 1))
        seq = cutlass.Int32(pos_t[m]) + 1  # 0 for a pad row
        out_row = cute.make_tensor(out + m * self.k, cute.make_layout(self.k))
        if seq <= self.k:
            # the whole context, then -1s (every CTA of the cluster takes this branch)
            for i in cutlass.range((c * THREADS + t), self.k, self.cluster * THREADS,
                                  unroll=1):
                out_row[i] = cutlass.Int64(i) if i < seq else cutlass.Int64(-1)
            if cutlass.const_expr(self.push):
                cute.arch.cluster_wait()
        else:
            limit = cutlass.min(seq, width)
            if cutlass.const_expr(self.cluster == CLUSTER or not self.push):
                self._row(scores, m, stride, width, limit, out_row, hist, total, state,
                          warp_sums, count, gather, bars, trace, cta, t, lane, w, c,
                          self.cluster)
            else:
                # a context the first CLUSTER CTAs hold at once: the others leave (their
                # arrival at the start counted, nothing sent to them), fewer histograms a pass
                active = cutlass.Int32(CLUSTER)
                if limit > CLUSTER * self.chunk:
                    active = cutlass.Int32(self.cluster)
                if c < active:
                    self._row(scores, m, stride, width, limit, out_row, hist, total, state,
                              warp_sums, count, gather, bars, trace, cta, t, lane, w, c,
                              active)
                else:
                    cute.arch.cluster_wait()
            if cutlass.const_expr(not self.push):
                cute.arch.cluster_arrive()  # no CTA leaves while another reads its memory
                cute.arch.cluster_wait()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()


def held_sizes() -> tuple:
    """The smaller key counts a wide table's row may hold (HELD_SIZES, or none, SIZED off),
    each a multiple of VEC up to MAX_KEYS_PER_THREAD."""
    if not SIZED:
        return ()
    for n in HELD_SIZES:
        if n % VEC or not VEC <= n <= MAX_KEYS_PER_THREAD:
            raise ValueError(f"cluster_topk.HELD_SIZES: multiples of {VEC} up to "
                             f"{MAX_KEYS_PER_THREAD}, got {HELD_SIZES}")
    return tuple(sorted(set(HELD_SIZES)))


def keys_per_thread(width: int, cluster: int = CLUSTER) -> tuple:
    """(keys a thread holds, wide) for rows `width` wide, `cluster` CTAs a row: every key of
    the row at once up to cluster x THREADS x MAX_KEYS_PER_THREAD scores (64K at 8 CTAs); in a
    wider table the same, a row's context held at once up to that and loaded again each pass
    beyond."""
    kpt = _round_up(-(-width // (cluster * THREADS)), VEC)
    return (kpt, False) if kpt <= MAX_KEYS_PER_THREAD else (MAX_KEYS_PER_THREAD, True)


def cluster_size(rows: int, width: int, device: int | None = None) -> int:
    """CTAs a row for `rows` rows of a table `width` wide: WIDE_CLUSTER where the table is
    wider than CLUSTER CTAs hold at once and the rows at most WIDE_CLUSTER_ROWS and, given
    the CUDA `device`, at most the clusters of WIDE_CLUSTER it holds at once; else CLUSTER."""
    if WIDE_CLUSTER not in (CLUSTER, 2 * CLUSTER):
        raise ValueError(f"cluster_topk.WIDE_CLUSTER: {CLUSTER} or {2 * CLUSTER}, got "
                         f"{WIDE_CLUSTER}")
    if WIDE_CLUSTER == CLUSTER or not keys_per_thread(width)[1] or rows > WIDE_CLUSTER_ROWS:
        return CLUSTER
    if device is not None and rows > clusters_resident(device, WIDE_CLUSTER):
        return CLUSTER
    return WIDE_CLUSTER


def launch_form(rows: int, wide: bool, device: int | None = None) -> tuple:
    """(roll, prefetch, CTAs an SM) of a launch of `rows` rows whose keys are loaded again
    each pass where `wide`: the next tile prefetched up to PREFETCH_ROWS rows and no more than
    the CUDA `device` holds clusters of CLUSTER at once at one CTA an SM (``clusters_resident``;
    PREFETCH_ROWS_UNQUERIED where no device is named or the query fails), the passes rolled
    where the prefetch runs and up to ROLL_ROWS rows, two CTAs an SM where a rolled launch's
    clusters would not all fit at one."""
    held = (clusters_resident(device, CLUSTER) if device is not None else 0) \
        or PREFETCH_ROWS_UNQUERIED
    prefetch = PREFETCH and wide and rows <= min(PREFETCH_ROWS, held)
    roll = ROLL and (prefetch or rows <= ROLL_ROWS)
    return roll, prefetch, 2 if roll and rows > held else 1


def prepare(device) -> None:
    """Ask the driver now what a launch would ask it at first use (how many clusters of
    CLUSTER, and of WIDE_CLUSTER, the torch `device` holds), so that no CUDA-graph capture sees
    the query: at a layer's build."""
    import torch

    with torch.cuda.device(device):
        for size in sorted({CLUSTER, WIDE_CLUSTER}):
            clusters_resident(torch.cuda.current_device(), size)


@functools.lru_cache(maxsize=None)
def clusters_resident(device: int, size: int) -> int:
    """Clusters of `size` CTAs the CUDA `device` holds at once at one CTA an SM (the driver's
    occupancy query through CuTe DSL; the device's context current), once a process; 0,
    logged, where the query fails (a cluster of 16 is a non-portable size: a GPU may hold
    none)."""
    try:
        from cutlass.utils import HardwareInfo

        held = int(HardwareInfo(device).get_max_active_clusters(size))
    except Exception as e:  # noqa: BLE001 - any failure means: do not launch that size
        logger.warning("cluster_topk: the occupancy query for clusters of %d CTAs failed "
                       "(%s: %s); rows take %d CTAs", size, type(e).__name__, e, CLUSTER)
        return 0
    logger.info("cluster_topk: device %d holds %d clusters of %d CTAs at once", device, held,
                size)
    return held


def _int(bits: int):
    return cutlass.Int32 if bits == 32 else cutlass.Int64


@functools.lru_cache(maxsize=None)
def _compiled(k: int, kpt: int, pdl: bool, pos_bits: int = 32, wide: bool = False,
              vec: bool = True, push: bool = True, trace: bool = False,
              prefetch: bool = True, sizes: tuple = (), skip: bool = True,
              skip_write: bool = False, skip_reloaded: bool = True, cluster: int = CLUSTER,
              roll: bool = False, ctas_per_sm: int = 1):
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr

    kernel = ClusterTopk(k, kpt, pdl, wide, vec, push, trace, prefetch, sizes, skip,
                         skip_write, skip_reloaded, cluster, roll, ctas_per_sm)
    gmem = cute.AddressSpace.gmem
    ptrs = (make_ptr(cutlass.Int32, 16, gmem, 4), make_ptr(_int(pos_bits), 16, gmem, 4),
            make_ptr(cutlass.Int64, 16, gmem, 8), make_ptr(cutlass.Int64, 16, gmem, 8))
    fn = cute.compile(kernel, *ptrs, 1, 1, 1, cuda.CUstream(0))
    return kernel, fn


def vector_loads(scores) -> bool:
    """Whether the rows of `scores` load VEC keys at a time (16-byte aligned runs: the start
    aligned, the width and the row stride multiples of VEC); else one key a load."""
    return (scores.shape[1] % VEC == 0 and scores.stride(0) % VEC == 0
            and scores.data_ptr() % (VEC * scores.element_size()) == 0)


def refusal(scores, positions, k: int, out) -> str | None:
    """Why this kernel cannot take these tensors (None: it can)."""
    import torch

    if scores.dim() != 2 or scores.dtype != torch.float32 or scores.stride(1) != 1:
        return "cluster_topk: scores must be fp32 [M, W] with unit column stride"
    if scores.shape[1] >= 1 << 31:
        return "cluster_topk: rows below 2^31 scores (int32 positions)"
    if positions.dtype not in (torch.int32, torch.int64) or positions.shape[0] < scores.shape[0]:
        return "cluster_topk: positions must be int32 or int64 [>= M]"
    if out.dtype != torch.int64 or out.shape != (scores.shape[0], k) or not out.is_contiguous():
        return f"cluster_topk: out must be a contiguous int64 [{scores.shape[0]}, {k}]"
    if k >= 1 << 15:
        return "cluster_topk: k below 32768 (a CTA's counts are packed in 16 bits)"
    return None


def topk_positions(scores, positions, k: int, out, pdl: bool = False, trace=None) -> None:
    """out int64 [M, k] = ascending positions of row m's k best scores among its first
    positions[m] + 1 (int32 or int64; all of them, then -1s, when that is <= k), as
    topk.topk_positions; on the current torch stream, graph-capturable. pdl: launched
    programmatically dependent (it waits for the previous kernel before reading anything).
    trace: measurement only, int64 [M x cluster_size(M, W, device), len(TRACE_POINTS)]
    (``ClusterTopk.trace``)."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    reason = refusal(scores, positions, k, out)
    if reason:
        raise ValueError(reason)
    m, width = scores.shape
    pos_bits = positions.element_size() * 8
    cluster = cluster_size(m, width, scores.device.index)
    kpt, wide = keys_per_thread(width, cluster)
    if trace is not None and (trace.dtype != torch.int64 or not trace.is_contiguous()
                              or trace.numel() < m * cluster * len(TRACE_POINTS)):
        raise ValueError("cluster_topk: trace must be a contiguous int64 "
                         f"[{m * cluster}, {len(TRACE_POINTS)}]")
    roll, prefetch, ctas_per_sm = launch_form(m, wide, scores.device.index)
    _, fn = _compiled(k, kpt, bool(pdl), pos_bits, wide, vector_loads(scores), PUSH,
                      trace is not None, prefetch, held_sizes(), SKIP, SKIP_WRITE,
                      SKIP_RELOADED, cluster, roll, ctas_per_sm)
    gmem = cute.AddressSpace.gmem
    stream = cuda.CUstream(torch.cuda.current_stream(scores.device).cuda_stream)
    fn(make_ptr(cutlass.Int32, scores.data_ptr(), gmem, 4),
       make_ptr(_int(pos_bits), positions.data_ptr(), gmem, 4),
       make_ptr(cutlass.Int64, out.data_ptr(), gmem, 8),
       make_ptr(cutlass.Int64, (trace if trace is not None else out).data_ptr(), gmem, 8),
       m, scores.stride(0), width, stream)
