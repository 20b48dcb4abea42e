"""Exact top-k of the indexer scores over long rows as one launch (CuTe DSL, sm_90): a thread
block cluster a row, whose CTAs meet in distributed shared memory between radix passes.

The Triton split top-k (``triton/topk.py``) cuts a row into 2048-score chunks and runs its four
radix passes and the write as six launches: ~4-5 us a pass is the hop between launches (or
between programs meeting at counters in global memory), and one program a row is no way out,
as Triton's histogram costs ~7 us a pass over 8K keys on one multiprocessor
(``topk.ONE_LAUNCH``'s note). Here a row is one cluster of CLUSTER CTAs, each holding
THREADS x keys_per_thread consecutive scores as keys in registers (the order-preserving int32
image of the fp32 scores), and each pass is
  1. every CTA's 256-bin histogram of the next 8 bits of its keys that share the digits found
     so far (shared-memory atomics, two buffers used in turn),
  2. a cluster barrier,
  3. each CTA summing the cluster's histograms bin by bin from the others' shared memory (so
     every CTA finds the same digit of the k-th largest key, and how many keys at it are still
     needed),
then the write: each thread counts its keys above the k-th and its ties, one scan over the CTA
and the counts of the CTAs before it (read from their shared memory after a barrier) place
them, and it stores the positions of its keys above and of the ties the lowest positions take
first (a stable descending sort's choice), ascending, as ``topk.topk_positions``: output int64
[M, k], -1 padded where a row's context (positions[m] + 1) fits in k, whose positions it takes
whole. Rows may be pads (position -1: every entry -1).
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cutlass_dsl import T, dsl_user_op

THREADS = 256  # a CTA's threads; BINS of them own a histogram bin each
BINS = 256  # 8-bit digits: four passes
CLUSTER = 8  # CTAs a row (the portable cluster size)
MAX_KEYS_PER_THREAD = 32  # registers a thread holds keys in: rows up to 64K scores
WARPS = THREADS // 32
SIGN = -2147483648  # 0x80000000 as an int32


@dsl_user_op
def _load_remote(smem_ptr: cute.Pointer, rank, *, loc=None, ip=None) -> cutlass.Int32:
    """The int32 at `smem_ptr` in the shared memory of the cluster's CTA `rank`
    (mapa, then ld.shared::cluster)."""
    remote = nvvm.mapa(llvm.PointerType.get(7), smem_ptr.to_llvm_ptr(loc=loc, ip=ip),
                       cutlass.Int32(rank).ir_value(loc=loc, ip=ip), loc=loc, ip=ip)
    addr = llvm.ptrtoint(T.i32(), remote, loc=loc, ip=ip)
    shared = llvm.inttoptr(llvm.PointerType.get(3), addr, loc=loc, ip=ip)
    return cute.arch.load(shared, cutlass.Int32, ss="cluster", loc=loc, ip=ip)


class ClusterTopk:
    """One compiled form: the top-k of rows of up to CLUSTER x THREADS x kpt scores."""

    def __init__(self, k: int, kpt: int, pdl: bool = False):
        if not 1 <= kpt <= MAX_KEYS_PER_THREAD:
            raise ValueError(f"cluster_topk: 1..{MAX_KEYS_PER_THREAD} keys a thread, got {kpt}")
        self.k, self.kpt, self.pdl = k, kpt, pdl
        self.chunk = THREADS * kpt
        self.width = CLUSTER * self.chunk

    @cute.jit
    def __call__(self, scores: cute.Pointer, positions: cute.Pointer, out: cute.Pointer,
                 rows: cutlass.Int32, stride: cutlass.Int32, width: cutlass.Int32, stream):
        @cute.struct
        class Storage:
            hist: cute.struct.MemRange[cutlass.Int32, 2 * BINS]
            total: cute.struct.MemRange[cutlass.Int32, BINS]
            warp: cute.struct.MemRange[cutlass.Int32, WARPS]
            state: cute.struct.MemRange[cutlass.Int32, 2]  # the digit found, keys still needed
            count: cute.struct.MemRange[cutlass.Int32, 1]  # this CTA's (above << 16) | ties

        self.storage = Storage
        self.kernel(scores, positions, out, stride, width).launch(
            grid=[rows * CLUSTER, 1, 1], block=[THREADS, 1, 1], cluster=[CLUSTER, 1, 1],
            smem=Storage.size_in_bytes(), stream=stream, use_pdl=self.pdl)

    @cute.jit
    def _block_scan(self, value, lane, w, warp_sums: cute.Tensor):
        """(exclusive prefix of `value` over the CTA's threads in order, the CTA's total)."""
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
    def _digit(self, lane, total: cute.Tensor, state: cute.Tensor, need):
        """Warp 0: the highest bin whose keys and those of the bins above it number at least
        `need` (the next digit of the k-th largest key) into state[0], and `need` less the keys
        above that bin into state[1]; each lane holds 8 bins."""
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

    @cute.kernel
    def kernel(self, scores: cute.Pointer, positions: cute.Pointer, out: cute.Pointer,
               stride: cutlass.Int32, width: cutlass.Int32):
        t, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane = t % 32
        w = t // 32
        m = cta // CLUSTER
        c = cta % CLUSTER
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        hist = storage.hist.get_tensor(cute.make_layout(2 * BINS))
        total = storage.total.get_tensor(cute.make_layout(BINS))
        warp_sums = storage.warp.get_tensor(cute.make_layout(WARPS))
        state = storage.state.get_tensor(cute.make_layout(2))
        count = storage.count.get_tensor(cute.make_layout(1))
        hist[t] = cutlass.Int32(0)
        hist[t + BINS] = cutlass.Int32(0)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        pos_t = cute.make_tensor(positions, cute.make_layout(m + 1))
        seq = cutlass.Int32(pos_t[m]) + 1  # 0 for a pad row
        out_row = cute.make_tensor(out + m * self.k, cute.make_layout(self.k))
        if seq <= self.k:
            # the whole context, then -1s (every CTA of the cluster takes this branch)
            for i in cutlass.range((c * THREADS + t), self.k, CLUSTER * THREADS, unroll=1):
                out_row[i] = cutlass.Int64(i) if i < seq else cutlass.Int64(-1)
        else:
            limit = cutlass.min(seq, width)
            row = cute.make_tensor(scores + m * stride, cute.make_layout(self.width))
            first = c * self.chunk + t * self.kpt
            keys = cute.make_rmem_tensor(cute.make_layout(self.kpt), cutlass.Int32)
            for j in cutlass.range_constexpr(self.kpt):
                bits = cutlass.Int32(0)
                if first + j < limit:
                    bits = row[first + j]
                # order-preserving image of the fp32 bits (signed compare), then unsigned bits
                keys[j] = bits ^ ((bits >> 31) & 0x7FFFFFFF)
            cute.arch.barrier()  # the zeroed histograms before any atomic
            found = cutlass.Int32(0)  # the digits found so far, in place (unsigned image)
            need = cutlass.Int32(self.k)
            for p in cutlass.range_constexpr(4):
                shift = 24 - 8 * p
                buf = (p % 2) * BINS
                for j in cutlass.range_constexpr(self.kpt):
                    u = keys[j] ^ SIGN
                    match = first + j < limit
                    if cutlass.const_expr(p > 0):
                        high = -(1 << (shift + 8))  # the bits above this digit
                        match = match & ((u & high) == found)
                    if match:
                        cute.arch.atomic_add(hist.iterator + (buf + ((u >> shift) & 0xFF)),
                                             cutlass.Int32(1), sem="relaxed", scope="cta")
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
                got = cutlass.Int32(0)
                for r in cutlass.range_constexpr(CLUSTER):
                    got = got + _load_remote(hist.iterator + (buf + t), r)
                total[t] = got
                # the other buffer was read by every CTA in the pass before this barrier
                hist[((p + 1) % 2) * BINS + t] = cutlass.Int32(0)
                cute.arch.barrier()
                if w == 0:
                    self._digit(lane, total, state, need)
                cute.arch.barrier()
                found = found | (state[0] << shift)
                need = state[1]
            kth = found ^ SIGN  # the k-th largest key, signed image
            above = cutlass.Int32(0)
            ties = cutlass.Int32(0)
            for j in cutlass.range_constexpr(self.kpt):
                if first + j < limit:
                    if keys[j] > kth:
                        above = above + 1
                    if keys[j] == kth:
                        ties = ties + 1
            before, cta_total = self._block_scan((above << 16) | ties, lane, w, warp_sums)
            if t == 0:
                count[0] = cta_total
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            taken_before = cutlass.Int32(0)  # entries the CTAs before this one write
            ties_before = cutlass.Int32(0)
            for r in cutlass.range_constexpr(CLUSTER - 1):
                if r < c:
                    theirs = _load_remote(count.iterator, r)
                    their_ties = theirs & 0xFFFF
                    taken_before = (taken_before + (theirs >> 16)
                                    + cutlass.min(their_ties,
                                                  cutlass.max(need - ties_before, 0)))
                    ties_before = ties_before + their_ties
            tie_rank = ties_before + (before & 0xFFFF)
            at = (taken_before + (before >> 16)
                  + cutlass.min(before & 0xFFFF, cutlass.max(need - ties_before, 0)))
            for j in cutlass.range_constexpr(self.kpt):
                if first + j < limit:
                    take = keys[j] > kth
                    if keys[j] == kth:
                        take = tie_rank < need
                        tie_rank = tie_rank + 1
                    if take:
                        out_row[at] = cutlass.Int64(first + j)
                        at = at + 1
            cute.arch.cluster_arrive()  # no CTA leaves while another reads its count
            cute.arch.cluster_wait()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()


def keys_per_thread(width: int) -> int:
    """Keys a thread holds for rows `width` wide (0: wider than this kernel takes)."""
    kpt = -(-width // (CLUSTER * THREADS))
    return kpt if kpt <= MAX_KEYS_PER_THREAD else 0


def _int(bits: int):
    return cutlass.Int32 if bits == 32 else cutlass.Int64


@functools.lru_cache(maxsize=None)
def _compiled(k: int, kpt: int, pdl: bool, pos_bits: int = 32):
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr

    kernel = ClusterTopk(k, kpt, pdl)
    gmem = cute.AddressSpace.gmem
    ptrs = (make_ptr(cutlass.Int32, 16, gmem, 4), make_ptr(_int(pos_bits), 16, gmem, 4),
            make_ptr(cutlass.Int64, 16, gmem, 8))
    fn = cute.compile(kernel, *ptrs, 1, 1, 1, cuda.CUstream(0))
    return kernel, fn


def refusal(scores, positions, k: int, out) -> str | None:
    """Why this kernel cannot take these tensors (None: it can)."""
    import torch

    if scores.dim() != 2 or scores.dtype != torch.float32 or scores.stride(1) != 1:
        return "cluster_topk: scores must be fp32 [M, W] with unit column stride"
    if not keys_per_thread(scores.shape[1]):
        return (f"cluster_topk: rows up to {CLUSTER * THREADS * MAX_KEYS_PER_THREAD} scores, "
                f"got {scores.shape[1]}")
    if positions.dtype not in (torch.int32, torch.int64) or positions.shape[0] < scores.shape[0]:
        return "cluster_topk: positions must be int32 or int64 [>= M]"
    if out.dtype != torch.int64 or out.shape != (scores.shape[0], k) or not out.is_contiguous():
        return f"cluster_topk: out must be a contiguous int64 [{scores.shape[0]}, {k}]"
    if k >= 1 << 15:
        return "cluster_topk: k below 32768 (a CTA's counts are packed in 16 bits)"
    return None


def topk_positions(scores, positions, k: int, out, pdl: bool = False) -> None:
    """out int64 [M, k] = ascending positions of row m's k best scores among its first
    positions[m] + 1 (int32 or int64; all of them, then -1s, when that is <= k), as
    topk.topk_positions; on the current torch stream, graph-capturable. pdl: launched
    programmatically dependent (it waits for the previous kernel before reading anything)."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    reason = refusal(scores, positions, k, out)
    if reason:
        raise ValueError(reason)
    m, width = scores.shape
    pos_bits = positions.element_size() * 8
    _, fn = _compiled(k, keys_per_thread(width), bool(pdl), pos_bits)
    gmem = cute.AddressSpace.gmem
    stream = cuda.CUstream(torch.cuda.current_stream(scores.device).cuda_stream)
    fn(make_ptr(cutlass.Int32, scores.data_ptr(), gmem, 4),
       make_ptr(_int(pos_bits), positions.data_ptr(), gmem, 4),
       make_ptr(cutlass.Int64, out.data_ptr(), gmem, 8), m, scores.stride(0), width, stream)
