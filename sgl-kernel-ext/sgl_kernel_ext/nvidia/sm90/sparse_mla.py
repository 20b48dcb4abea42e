"""Sparse MLA decode over each row's top-k cache rows on Hopper's tensor cores (CuTe DSL).

The contract of the Triton stage kernel ``triton.mla.sparse_attention`` (with merge=False):
row m's top-k entries (context positions, -1 = none) are dealt into `splits` chunks of whole
64-entry blocks (``_chunk_range``), and CTA (m, chunk) writes the chunk's unnormalized output
part_o fp32 [M, S, heads, 512] and its (max, sum) part_ml fp32 [M, S, heads, 2], the max in
the scaled score's natural-log units, so the Triton combine (or absorb_v's merge) follows
unchanged.

Why a second kernel: Triton pads a rank's 8 heads to an MMA's 16 rows and runs each 64-entry
step as dependent mma.sync chains across 8 warps; at 9-16 rows its loop is bound by that
instruction latency, not by HBM (``triton.mla``'s notes). Here the heads are wgmma's N:

- scores S^T [64 entries, 8 heads] = K . q^T: the gathered KV rows are the A operand (m64,
  K-major), q the B operand (n8), 36 async k16 MMAs in four independent chains;
- out O^T [512 latent columns, 8 heads] += V^T . P^T: the *same* shared-memory KV tile read
  MN-major as A (a 128-byte-swizzled K-major atom of 8 rows x 64 columns is bitwise the
  MN-major atom of 64 x 8, and both layouts stack their atoms alike), P^T the B operand,
  written into the tile's rope columns once the scores have read them.

Work in a CTA: warpgroup 0 gathers (8 threads a KV row, each 16 bytes of every 128, so a
warp's cp.async covers 4 whole lines; zeros where an entry does not exist) into a ring of 2
(or 3) 72 KB tiles with mbarriers; its slot lookups are loads without branches, the top-k
positions of step + LOOKUP + 1 read a step before their slots, so no load in its loop waits
for another. Warpgroup 1 runs the MMAs and the online softmax (exp2; a column max crosses the
4 warps through shared memory), issuing the next step's scores while a step's PV runs.
Entries and cache rows come from two or more kernels back, so the gather starts before the
programmatic wait (``triton.overlap``'s rule); only q, written by the previous kernel, is read
after it. Heads: exactly 8 (one TP8 rank of GLM-5.3); the refusal says so for others.

Measured on an H200 (GPU tests: test/srt/kernels/test_sm90_sparse_mla.py, the layer's
SGL_KERNEL_EXT_SM90_ATTN case), at 9e54f0a (results/sm90_attn_probe_20261202T204203Z, slots
scattered; T204218Z, slots in order as the layer benchmarks'): alone 9.8 / 13.0 / 17.3 us
against Triton's 12.7 / 20.5 / 26.1 at 8 / 12 / 16 rows (the KV rows' floor 4.6 / 7.0 / 9.3),
5.8 against 6.7 at 4, 0.8-1.0 us slower at 1-2; in the layer see ``sm90.ATTN``. Where the
time goes (the probe's measurement-only forms): the gather alone (no_mma) is 15.0 us at 16
rows and 3.4 at one (a CTA's first rows three dependent loads from its start), the consumer
alone (no_load) 7.1 and 3.4. Under Nsight Compute at 16 rows (results/ncu_attn_499d9a1.txt,
cold caches) the kernel reads DRAM at 45% of its peak and the gather alone at 50%, its warps
waiting on memory 88% of their cycles: one warpgroup's cp.async in flight bounds part of it.
Two gathering warpgroups (gatherers=2, 384 threads, 142 registers, outputs bitwise the same)
at ac3a1de (sm90_attn_probe_20261203T042806Z): 15.1 / 12.4 / 9.4 / 5.4 / 4.8 us against one's
17.3 / 13.5 / 9.9 / 5.9 / 5.2 at 16 / 12 / 8 / 4 / 1 rows, their gather alone 12.8 at 16 rows
(one's 15.0); the layer takes two from ``sm90.ATTN_GATHERERS_FROM_ROWS`` rows.

What it took: the slot lookups. Written as two dependent loads behind branches, each step's
lookups stalled the gathering warps (ncu at 16 rows: 80% of their cycles waiting on memory,
DRAM at 37% of its peak; results/ncu_attn_28b320a.txt) and bounded the loop at 4-5 us a step
whatever else changed: 21.2 us at 16 rows, the gather alone 19.3
(sm90_attn_probe_20261202T203036Z). Tried before that and not kept: the producer waiting for
each step's rows before gathering the next, a thread a half row (each warp's cp.async 32
lines): 22 us alone at 16 rows (the layer +3.7 us, tiling_probe_20261202T165318Z); the slots
looked up one step ahead rather than four: the same. Tried since, each correct on the H200,
none faster: 3 stages (18.4 against 17.3 us at 16 rows); each step signalled by its copies'
own completion (cp.async.mbarrier.arrive.noinc, the producer never waiting for its loads):
within 0.4 us alone and 0.7 in the layer, with the old lookups and the new (tiling_probe_
20261202T204316Z); and, with the old lookups (sm90_attn_probe_20261202T201659Z,
tiling_probe_20261202T201751Z, at 28b320a), the rows of the steps past the ring asked of L2
early (0.2-2 us slower alone, up to 3.7 in the layer) and two consumer warpgroups taking the
steps in turn, merged through the freed ring (within 1 us in the layer). Tried at ed30bb2 (code
there): the gather's cp.async with an L2 prefetch-size hint, .L2::128B or .L2::256B (as
FlashMLA's Hopper gather asks; LDGSTS.E.BYPASS.LTC256B in the SASS): bitwise the same
(results/pytest_sm90_attn_l2_ed30bb2.log) and slower alone at every row count, 0.1-0.6 us
with one gathering warpgroup or two, the slots in order or scattered
(sm90_attn_probe_20261204T114517Z, T114533Z). Tried at 8687160 (code there): each row's
chunks merged in the launch, so no combine kernel follows (every CTA of the row counted in,
waited for the row's last chunk, then merged its share of the 8 x 512 outputs; the launch's
M x S CTAs all resident). Correct at 1-9 rows in its GPU tests (at 16 a few outputs were more
than a bf16 step from the combine's, where terms cancel and the order of their sum differs;
results/pytest_sm90_attn_merge_8687160.log), but slower in the layer wherever the combine
runs: a MoE layer +0.5 / +0.7 / +2.8 / +3.8 / +3.3 us at 2 / 4 / 8 / 12 / 16 rows, a dense
one +1.5 / +0.5 / +0.7 / +4.2 / +4.7 (tiling_probe_20261204T164015Z: sm90_attn_combine
against it): every CTA of a row then waits for the row's slowest chunk and one more round
trip, where the combine's programs start as the last chunks end. The consumer
releases a slot only after issuing the next step's scores, so the producer must signal every
step it issued before it waits for a slot (d50fe63 did not, and deadlocked from 3 steps a
CTA). On CPU (sm_90a SASS): the consumer's loop is 565 instructions a step a warp, 68 of them
HGMMA and 111 R2UR (wgmma descriptors computed in regular registers, then moved to uniform
ones); unrolling it by the stages so that each slot's descriptors are constants made it 561
a step with 175 R2UR and 178 registers (the shared-memory base is not a compile-time
constant): not kept.
"""

from __future__ import annotations

import functools
import math

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

HEADS = 8  # wgmma's N
LATENT = 512  # kv_lora: the V columns
ROPE = 64
WIDTH = LATENT + ROPE  # a cache row: 1152 bytes, 72 chunks of 16
BLOCK_T = 64  # top-k entries a step: wgmma's M for the scores
STAGES = 2  # 72 KB a tile (three and q's 9 KB would take 226 KB of the 227 a CTA may have)
GATHERERS = 1  # gathering warpgroups
CHUNKS = WIDTH * 2 // 16
LOOKUP = 4  # steps whose slots a gathering thread has looked up (a 16-row chunk's all)
LOG2E = 1.4426950408889634
ABLATIONS = ("", "no_mma", "no_load")  # SparseMla's measurement-only forms


class SparseMla:
    """One compiled form: pdl (launched programmatically dependent), rows (the slot table is
    a pool's, row slot_rows[m] for row m); the slot table's and the top-k's integer types are
    the pointers'."""

    def __init__(self, pdl: bool, rows: bool, stages: int = 0, ablate: str = "",
                 gatherers: int = 0):
        self.pdl, self.rows = pdl, rows
        self.stages = stages or STAGES
        self.gatherers = gatherers or GATHERERS
        self.producers = 128 * self.gatherers
        self.row_stride = self.producers // 8  # a step's entries t // 8 + row_stride * i
        self.rows_per_thread = BLOCK_T // self.row_stride
        # measurement only (benchmark/sm90_attn_probe.py), the parts it writes are not the
        # attention's: "no_mma" (the consumer releases each step's tile without its MMAs or
        # softmax: the gather alone) or "no_load" (the producer signals each step without
        # copying its rows: the consumer alone)
        self.ablate = ablate
        self.threads = (self.gatherers + 1) * 128

    @cute.jit
    def __call__(self, q: cute.Pointer, kv: cute.Pointer, topk: cute.Pointer,
                 slots: cute.Pointer, slot_rows: cute.Pointer, part_o: cute.Pointer,
                 part_ml: cute.Pointer, m_rows: cutlass.Int32, splits: cutlass.Int32,
                 blocks: cutlass.Int32, stride_topk: cutlass.Int32,
                 stride_slots: cutlass.Int32, scale_log2: cutlass.Float32, stream):
        bf16 = cutlass.BFloat16
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            bf16, bf16, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
            tiler_mn=(BLOCK_T, HEADS))
        mma_qk0 = sm90_utils.make_trivial_tiled_mma(
            bf16, bf16, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
            tiler_mn=(BLOCK_T, HEADS))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            bf16, bf16, OperandMajorMode.MN, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
            tiler_mn=(BLOCK_T, HEADS))
        kv_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR,
                                                  (BLOCK_T, HEADS, WIDTH), bf16, 1)
        vt_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR,
                                                  (LATENT, HEADS, BLOCK_T), bf16, 1)
        q_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR,
                                                 (BLOCK_T, HEADS, WIDTH), bf16, 1)
        p_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR,
                                                 (LATENT, HEADS, BLOCK_T), bf16, 1)

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            red: cute.struct.MemRange[cutlass.Float32, 4 * HEADS]
            skv: cute.struct.Align[cute.struct.MemRange[bf16, self.stages * BLOCK_T * WIDTH],
                                   1024]
            sq: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(q_layout)], 1024]

        self.storage = Storage
        self.kernel(q, kv, topk, slots, slot_rows, part_o, part_ml, splits, blocks, stride_topk,
                    stride_slots, scale_log2, mma_qk0, mma_qk, mma_pv, kv_layout, vt_layout,
                    q_layout, p_layout).launch(grid=[m_rows, splits, 1],
                                               block=[self.threads, 1, 1],
                                               smem=Storage.size_in_bytes(), stream=stream,
                                               use_pdl=self.pdl)

    @cute.jit
    def _position(self, tk: cute.Tensor, entry, lo, hi):
        """Top-k position `entry` of the row (-1 at or past hi), loaded without a branch."""
        pos = cutlass.Int64(tk[entry if entry < hi else lo])
        return pos if entry < hi else cutlass.Int64(-1)

    @cute.jit
    def _slot(self, table: cute.Tensor, pos):
        """The cache slot of a context position (-1 for -1), loaded without a branch."""
        slot = cutlass.Int64(table[pos if pos >= 0 else cutlass.Int64(0)])
        return slot if pos >= 0 else cutlass.Int64(-1)

    @cute.jit
    def _gather(self, kv: cute.Pointer, raw: cute.Pointer, stage, slot, token, c8, atom):
        """This thread's 16 bytes of each 128-byte column block of one KV row (9 cp.async;
        the 8 lanes beside it take the rest of each block, so a warp's request is 4 whole
        lines) into the stage's swizzled tile, or zeros where the entry does not exist."""
        if slot >= 0:
            for kb in cutlass.range_constexpr(CHUNKS // 8):
                c = kb * 8 + c8
                src = cute.make_tensor(kv + cute.assume(slot * WIDTH + c * 8, divby=8),
                                       cute.make_layout(8))
                cute.copy(atom, src, self._chunk(raw, stage, token, c))
        else:
            for kb in cutlass.range_constexpr(CHUNKS // 8):
                self._chunk(raw, stage, token, kb * 8 + c8).fill(cutlass.BFloat16(0.0))

    @cute.jit
    def _chunk(self, raw: cute.Pointer, stage, token, c):
        """Chunk c (16 bytes) of an entry's row in a stage's K-major 128B-swizzled tile:
        8 KB a 64 columns, 128 B a row, the chunk's place in the row XOR the row's in 8."""
        off = (stage * (BLOCK_T * WIDTH) + (c // 8) * (BLOCK_T * 64) + token * 64
               + ((c % 8) ^ (token % 8)) * 8)
        return cute.make_tensor(raw + cute.assume(off, divby=8), cute.make_layout(8))

    @cute.jit
    def _arrive_complete(self, full: cute.Pointer, upto, arrived):
        """Signal steps [arrived, upto) (at most `stages`, the newest cp.async groups) in
        order, each as soon as its group is complete."""
        for k in cutlass.range_constexpr(self.stages - 1, -1, -1):
            if upto - 1 - k >= arrived:
                cute.arch.cp_async_wait_group(k)
                cute.arch.fence_view_async_shared()
                cute.arch.mbarrier_arrive(full + (upto - 1 - k) % self.stages)

    @cute.jit
    def _rows_exist(self, ok: cute.Tensor, tk: cute.Tensor, lo, step, c_s: cute.Tensor):
        """Whether this thread's two score rows (entries) of a step exist."""
        for r in cutlass.range_constexpr(2):
            ok[r] = tk[lo + step * BLOCK_T + c_s[2 * r][0]] >= 0

    @cute.jit
    def _issue_scores(self, mma_qk0: cute.TiledMma, mma_qk: cute.TiledMma, thr_qk,
                      t_b_q: cute.Tensor,
                      kv_layout: cute.ComposedLayout, skv: cute.Pointer, full: cute.Pointer,
                      step, a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor):
        """Wait for step's KV tile, then issue its scores K . q^T as four MMA chains (a0..a3,
        every fourth 16-column block each) and commit them."""
        s = step % self.stages
        tile = skv + s * (BLOCK_T * WIDTH)
        s_kv = cute.make_tensor(cute.recast_ptr(tile, kv_layout.inner, dtype=cutlass.BFloat16),
                                kv_layout.outer)
        t_a_kv = mma_qk.make_fragment_A(thr_qk.partition_A(s_kv))
        cute.arch.mbarrier_wait(full + s, (step // self.stages) % 2)
        warpgroup.fence()
        accs = (a0, a1, a2, a3)
        for kb in cutlass.range_constexpr(cute.size(t_a_kv, mode=[2])):
            cute.gemm(mma_qk if kb >= 4 else mma_qk0, accs[kb % 4], t_a_kv[(None, None, kb, 0)],
                      t_b_q[(None, None, kb, 0)], accs[kb % 4])
        warpgroup.commit_group()

    @cute.jit
    def _softmax_pv(self, step, lo, tk: cute.Tensor, scale_log2, c_s: cute.Tensor,
                    c_o: cute.Tensor, a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor,
                    a3: cute.Tensor, acc_s: cute.Tensor, acc_o: cute.Tensor, m_run: cute.Tensor,
                    l_run: cute.Tensor, alpha: cute.Tensor, m_use: cute.Tensor, ok: cute.Tensor,
                    red: cute.Tensor, warp, lane, col0, mma_pv: cute.TiledMma, thr_pv,
                    vt_layout: cute.ComposedLayout, p_layout: cute.ComposedLayout,
                    skv: cute.Pointer):
        """A step's online softmax over its completed scores (a0..a3; ok: which of this
        thread's two score rows exist), P^T into the tile, acc_o rescaled, then its PV issued
        and committed (not waited for)."""
        bf16 = cutlass.BFloat16
        s = step % self.stages
        tile = skv + s * (BLOCK_T * WIDTH)
        s_vt = cute.make_tensor(cute.recast_ptr(tile, vt_layout.inner, dtype=bf16),
                                vt_layout.outer)
        t_a_vt = mma_pv.make_fragment_A(thr_pv.partition_A(s_vt))
        # P^T in the tile's rope columns (8 KB from 64 KB in), which only the scores
        # read: the slot is refilled only after PV released it
        s_p = cute.make_tensor(cute.recast_ptr(tile + LATENT * BLOCK_T, p_layout.inner,
                                               dtype=bf16), p_layout.outer)
        t_b_p = mma_pv.make_fragment_B(thr_pv.partition_B(s_p))
        # scores in log2 units, the tile's max a head across the warpgroup
        for v in cutlass.range_constexpr(4):
            z = (a0[v] + a1[v]) + (a2[v] + a3[v])
            acc_s[v] = z * scale_log2 if ok[v // 2] else -math.inf
        for j in cutlass.range_constexpr(2):
            mx = cute.arch.fmax(acc_s[j], acc_s[j + 2])
            for x in cutlass.range_constexpr(3):
                mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, 4 << x))
            if lane < 4:
                red[warp, col0 + j] = mx
        cute.arch.barrier(barrier_id=1, number_of_threads=128)
        for j in cutlass.range_constexpr(2):
            mx = cute.arch.fmax(cute.arch.fmax(red[0, col0 + j], red[1, col0 + j]),
                                cute.arch.fmax(red[2, col0 + j], red[3, col0 + j]))
            m_new = cute.arch.fmax(m_run[j], mx)
            m_use[j] = m_new if m_new != -math.inf else 0.0
            alpha[j] = cute.arch.exp2(m_run[j] - m_use[j])
            m_run[j] = m_new
        for v in cutlass.range_constexpr(4):
            acc_s[v] = cute.arch.exp2(acc_s[v] - m_use[v % 2])
        for j in cutlass.range_constexpr(2):
            l_run[j] = l_run[j] * alpha[j] + acc_s[j] + acc_s[j + 2]
        for e in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[e] = acc_o[e] * alpha[c_o[e][1] % 2]
        for v in cutlass.range_constexpr(4):
            s_p[c_s[v][1], c_s[v][0], 0] = acc_s[v].to(bf16)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1, number_of_threads=128)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(t_a_vt, mode=[2])):
            cute.gemm(mma_pv, acc_o, t_a_vt[(None, None, kb, 0)],
                      t_b_p[(None, None, kb, 0)], acc_o)
        warpgroup.commit_group()

    @cute.jit
    def _load_q(self, q: cute.Pointer, m, t, sq: cute.Pointer):
        """Row m's absorbed query into the B operand's K-major 128B-swizzled atoms (8 heads x
        64 columns, 1 KB each), by cp.async, waited for and fenced for the MMAs."""
        atom_q = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.BFloat16,
                                     num_bits_per_copy=128)
        for i in cutlass.range(t, HEADS * CHUNKS, 128, unroll=1):
            h, c = i // CHUNKS, i % CHUNKS
            src = cute.make_tensor(q + cute.assume(m * (HEADS * WIDTH) + i * 8, divby=8),
                                   cute.make_layout(8))
            off = (c // 8) * (HEADS * 64) + h * 64 + ((c % 8) ^ h) * 8
            cute.copy(atom_q, src, cute.make_tensor(sq + cute.assume(off, divby=8),
                                                    cute.make_layout(8)))
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()

    @cute.kernel
    def kernel(self, q: cute.Pointer, kv: cute.Pointer, topk: cute.Pointer,
               slots: cute.Pointer, slot_rows: cute.Pointer, part_o: cute.Pointer,
               part_ml: cute.Pointer, splits: cutlass.Int32, blocks: cutlass.Int32,
               stride_topk: cutlass.Int32, stride_slots: cutlass.Int32,
               scale_log2: cutlass.Float32, mma_qk0: cute.TiledMma, mma_qk: cute.TiledMma,
               mma_pv: cute.TiledMma,
               kv_layout: cute.ComposedLayout, vt_layout: cute.ComposedLayout,
               q_layout: cute.ComposedLayout, p_layout: cute.ComposedLayout):
        bf16 = cutlass.BFloat16
        tidx, _, _ = cute.arch.thread_idx()
        m, sp, _ = cute.arch.block_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        t = tidx % 128
        lo = (sp * blocks // splits) * BLOCK_T
        hi = ((sp + 1) * blocks // splits) * BLOCK_T
        steps = (hi - lo) // BLOCK_T

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        full = storage.bars.data_ptr()
        empty = full + self.stages
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(full + s, self.producers)
                cute.arch.mbarrier_init(empty + s, 128)  # one consumer warpgroup a step
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()

        # (one gathering warpgroup: the comparison and thread index of the form measured)
        gathers = wg == 0 if self.gatherers == 1 else wg < self.gatherers
        if gathers:
            # the gather: thread tidx takes 16 bytes (tidx % 8) of every 128 of entries
            # tidx // 8 + row_stride i
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                       bf16, num_bits_per_copy=128)
            tg = t if self.gatherers == 1 else tidx
            tok0 = tg // 8
            c8 = tg % 8
            raw = storage.skv.data_ptr()
            # the slots of this thread's entries LOOKUP steps ahead (column j: step + j), so a
            # step's gather never waits for its lookup's two dependent loads
            ahead = cute.make_rmem_tensor(cute.make_layout((self.rows_per_thread, LOOKUP)),
                                          cutlass.Int64)
            # the positions of step + LOOKUP, whose slots the next step looks up: no load in
            # the gathering loop waits for another
            nxt = cute.make_rmem_tensor(cute.make_layout(self.rows_per_thread), cutlass.Int64)
            tk = cute.make_tensor(topk + m * stride_topk, cute.make_layout(hi))
            row = cutlass.Int64(m)
            if cutlass.const_expr(self.rows):
                row = cute.make_tensor(slot_rows, cute.make_layout(m + 1))[m]
            table = cute.make_tensor(slots + row * stride_slots, cute.make_layout(stride_slots))
            for j in cutlass.range_constexpr(LOOKUP + 1):
                for i in cutlass.range_constexpr(self.rows_per_thread):
                    entry = lo + j * BLOCK_T + tok0 + self.row_stride * i
                    pos = self._position(tk, entry, lo, hi)
                    if cutlass.const_expr(j < LOOKUP):
                        ahead[i, j] = pos
                    else:
                        nxt[i] = pos
            for j in cutlass.range_constexpr(LOOKUP):
                for i in cutlass.range_constexpr(self.rows_per_thread):
                    ahead[i, j] = self._slot(table, ahead[i, j])
            arrived = cutlass.Int32(0)
            for step in cutlass.range(steps, unroll=1):
                s = step % self.stages
                if step >= self.stages:
                    # every step issued is signalled before waiting for a slot: the consumer
                    # releases a slot only once it has the next step's tile (its scores
                    # overlap the slot's PV)
                    self._arrive_complete(full, step, arrived)
                    arrived = step
                    cute.arch.mbarrier_wait(empty + s, ((step // self.stages) + 1) % 2)
                if cutlass.const_expr(self.ablate != "no_load"):
                    for i in cutlass.range_constexpr(self.rows_per_thread):
                        self._gather(kv, raw, s, ahead[i, 0], tok0 + self.row_stride * i, c8,
                                     atom)
                cute.arch.cp_async_commit_group()
                for i in cutlass.range_constexpr(self.rows_per_thread):
                    for j in cutlass.range_constexpr(LOOKUP - 1):
                        ahead[i, j] = ahead[i, j + 1]
                    ahead[i, LOOKUP - 1] = self._slot(table, nxt[i])
                    nxt[i] = self._position(
                        tk, lo + (step + LOOKUP + 1) * BLOCK_T + tok0 + self.row_stride * i,
                        lo, hi)
            self._arrive_complete(full, steps, arrived)
        else:
            if cutlass.const_expr(self.ablate == "no_mma"):
                for step in cutlass.range(steps, unroll=1):
                    cute.arch.mbarrier_wait(full + step % self.stages, (step // self.stages) % 2)
                    cute.arch.mbarrier_arrive(empty + step % self.stages)
            else:
                warp = t // 32
                lane = t % 32
                if cutlass.const_expr(self.pdl):
                    cute.arch.griddepcontrol_wait()  # q is the previous kernel's
                s_q = storage.sq.get_tensor(q_layout.outer, swizzle=q_layout.inner)
                red = storage.red.get_tensor(cute.make_layout((4, HEADS), stride=(HEADS, 1)))
                self._load_q(q, m, t, storage.sq.data_ptr())
                cute.arch.barrier(barrier_id=1, number_of_threads=128)

                thr_qk = mma_qk.get_slice(t)
                thr_pv = mma_pv.get_slice(t)
                t_b_q = mma_qk.make_fragment_B(thr_qk.partition_B(s_q))
                c_s = thr_qk.partition_C(cute.make_identity_tensor((BLOCK_T, HEADS)))
                c_o = thr_pv.partition_C(cute.make_identity_tensor((LATENT, HEADS)))
                acc_s = cute.make_rmem_tensor(c_s.shape, cutlass.Float32)
                acc_o = cute.make_rmem_tensor(c_o.shape, cutlass.Float32)
                acc_o.fill(0.0)
                col0 = (lane % 4) * 2  # this thread's two heads (wgmma's C layout)
                m_run = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
                l_run = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
                alpha = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
                m_use = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
                m_run.fill(-math.inf)
                l_run.fill(0.0)
                tk = cute.make_tensor(topk + m * stride_topk, cute.make_layout(hi))
                mma_pv.set(warpgroup.Field.ACCUMULATE, True)  # acc_o: zeroed, then rescaled
                mma_qk0.set(warpgroup.Field.ACCUMULATE, False)  # each score chain's first block
                mma_qk.set(warpgroup.Field.ACCUMULATE, True)
                # the scores' K (576 columns) as QK_CHAINS independent MMA chains, summed after
                a0 = cute.make_rmem_tensor(c_s.shape, cutlass.Float32)
                a1 = cute.make_rmem_tensor(c_s.shape, cutlass.Float32)
                a2 = cute.make_rmem_tensor(c_s.shape, cutlass.Float32)
                a3 = cute.make_rmem_tensor(c_s.shape, cutlass.Float32)
                ok = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Boolean)
                self._rows_exist(ok, tk, lo, 0, c_s)
                skv = storage.skv.data_ptr()
                self._issue_scores(mma_qk0, mma_qk, thr_qk, t_b_q, kv_layout, skv, full, 0, a0, a1,
                                   a2, a3)
                warpgroup.wait_group(0)
                for step in cutlass.range(steps - 1, unroll=1):
                    self._softmax_pv(step, lo, tk, scale_log2, c_s, c_o, a0, a1, a2, a3, acc_s,
                                     acc_o, m_run, l_run, alpha, m_use, ok, red, warp, lane,
                                     col0, mma_pv, thr_pv, vt_layout, p_layout, skv)
                    # the next step's scores run while this step's PV does
                    self._issue_scores(mma_qk0, mma_qk, thr_qk, t_b_q, kv_layout, skv, full,
                                       step + 1, a0, a1, a2, a3)
                    self._rows_exist(ok, tk, lo, step + 1, c_s)  # loaded while the MMAs run
                    warpgroup.wait_group(0)
                    cute.arch.mbarrier_arrive(empty + step % self.stages)
                self._softmax_pv(steps - 1, lo, tk, scale_log2, c_s, c_o, a0, a1, a2, a3,
                                 acc_s, acc_o, m_run, l_run, alpha, m_use, ok, red, warp, lane,
                                 col0, mma_pv, thr_pv, vt_layout, p_layout, skv)
                warpgroup.wait_group(0)
                cute.arch.mbarrier_arrive(empty + (steps - 1) % self.stages)
                # the sum a head over the warpgroup, then the chunk's parts
                for j in cutlass.range_constexpr(2):
                    sm = l_run[j]
                    for x in cutlass.range_constexpr(3):
                        sm = sm + cute.arch.shuffle_sync_bfly(sm, 4 << x)
                    l_run[j] = sm
                cute.arch.barrier(barrier_id=1, number_of_threads=128)
                if lane < 4:
                    for j in cutlass.range_constexpr(2):
                        red[warp, col0 + j] = l_run[j]
                cute.arch.barrier(barrier_id=1, number_of_threads=128)
                base = (m * splits + sp) * HEADS
                g_o = cute.make_tensor(part_o + base * LATENT,
                                       cute.make_layout((LATENT, HEADS), stride=(1, LATENT)))
                for e in cutlass.range_constexpr(cute.size(acc_o)):
                    g_o[c_o[e][0], c_o[e][1]] = acc_o[e]
                if t < 4:
                    g_ml = cute.make_tensor(part_ml + base * 2, cute.make_layout((HEADS, 2),
                                                                               stride=(2, 1)))
                    for j in cutlass.range_constexpr(2):
                        total = (red[0, col0 + j] + red[1, col0 + j] + red[2, col0 + j]
                                 + red[3, col0 + j])
                        mx = m_run[j]
                        if mx != -math.inf:
                            mx = mx * math.log(2.0)
                        g_ml[col0 + j, 0] = mx
                        g_ml[col0 + j, 1] = total


def _int(bits: int):
    return cutlass.Int32 if bits == 32 else cutlass.Int64


@functools.lru_cache(maxsize=None)
def _compiled(pdl: bool, rows: bool, slot_bits: int, topk_bits: int = 32, stages: int = 0,
              ablate: str = "", gatherers: int = 0):
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr

    kernel = SparseMla(pdl, rows, stages or STAGES, ablate, gatherers or GATHERERS)
    gmem = cute.AddressSpace.gmem
    ptrs = (make_ptr(cutlass.BFloat16, 16, gmem, 16), make_ptr(cutlass.BFloat16, 16, gmem, 16),
            make_ptr(_int(topk_bits), 16, gmem, 4), make_ptr(_int(slot_bits), 16, gmem, 4),
            make_ptr(cutlass.Int64, 16, gmem, 8), make_ptr(cutlass.Float32, 16, gmem, 16),
            make_ptr(cutlass.Float32, 16, gmem, 8))
    fn = cute.compile(kernel, *ptrs, 1, 1, 1, 1, 1, 1.0, cuda.CUstream(0))
    return kernel, fn


def refusal(qcat, kv_cache, topk) -> str | None:
    """Why this kernel cannot take these shapes (None: it can)."""
    m, nh, width = qcat.shape
    if nh != HEADS:
        return f"sm90 sparse_mla takes {HEADS} heads a rank (wgmma's N), got {nh}"
    if width != WIDTH or kv_cache.shape[-1] != WIDTH:
        return (f"sm90 sparse_mla takes {LATENT}+{ROPE}-wide rows, got q {width} and cache "
                f"{kv_cache.shape[-1]}")
    if topk.shape[1] % BLOCK_T:
        return f"sm90 sparse_mla takes top-k widths a multiple of {BLOCK_T}, got {topk.shape[1]}"
    return None


def sparse_attention(qcat, kv_cache, topk, token_slots, sm_scale: float, part_o, part_ml,
                     slot_rows=None, pdl: bool = False, stages: int = 0,
                     ablate: str = "", gatherers: int = 0) -> None:
    """part_o fp32 [M, S, 8, 512] and part_ml fp32 [M, S, 8, 2] of each row's S top-k chunks
    (the module docstring), on the current torch stream; graph-capturable. qcat bf16
    [M, 8, 576], kv_cache bf16 [slots, 576], topk int32 [M, K] (positions, -1 = none; K a
    multiple of 64, each chunk at least one block; int64 too), token_slots int32/int64
    [M or pool rows, W] with slot_rows int64 [M] for a pool's table (``triton.mla.slot_args``).
    stages: KV tiles in flight (2 or 3; 0: STAGES). ablate: SparseMla's (measurement only).
    gatherers: warpgroups gathering KV rows (1 or 2; 0: GATHERERS)."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    reason = refusal(qcat, kv_cache, topk)
    if reason:
        raise ValueError(reason)
    m = qcat.shape[0]
    splits = part_o.shape[1]
    blocks = topk.shape[1] // BLOCK_T
    if not 1 <= splits <= blocks:
        raise ValueError(f"sm90 sparse_mla: {splits} chunks of {blocks} blocks of top-k entries")
    for name, t, dtype in (("qcat", qcat, torch.bfloat16), ("kv_cache", kv_cache, torch.bfloat16),
                           ("part_o", part_o, torch.float32), ("part_ml", part_ml, torch.float32)):
        if t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"sm90 sparse_mla: {name} must be a contiguous {dtype}, got "
                             f"{t.dtype}{'' if t.is_contiguous() else ' (strided)'}")
    if part_o.shape != (m, splits, HEADS, LATENT) or part_ml.shape != (m, splits, HEADS, 2):
        raise ValueError(f"sm90 sparse_mla: part_o {tuple(part_o.shape)} / part_ml "
                         f"{tuple(part_ml.shape)} do not match {m} rows x {splits} chunks")
    if topk.dtype not in (torch.int32, torch.int64) or topk.stride(1) != 1 or topk.shape[0] < m:
        raise ValueError("sm90 sparse_mla: topk must be int32/int64 [M, K] with unit column "
                         f"stride, got {topk.dtype} {tuple(topk.shape)} strides {topk.stride()}")
    if token_slots.dtype not in (torch.int32, torch.int64) or token_slots.stride(1) != 1:
        raise ValueError("sm90 sparse_mla: token_slots must be a row-major int32/int64 table")
    if slot_rows is not None and (slot_rows.dtype != torch.int64 or slot_rows.shape[0] < m):
        raise ValueError("sm90 sparse_mla: slot_rows must be int64 [M]")
    slot_bits, topk_bits = token_slots.element_size() * 8, topk.element_size() * 8
    if stages not in (0, 2, 3):
        raise ValueError(f"sm90 sparse_mla: 2 or 3 stages of 72 KB fit, not {stages}")
    if gatherers not in (0, 1, 2):
        raise ValueError(f"sm90 sparse_mla: 1 or 2 gathering warpgroups, not {gatherers}")
    if ablate not in ABLATIONS:
        raise ValueError(f"sm90 sparse_mla: no ablation {ablate!r} (there are {ABLATIONS})")
    _, fn = _compiled(bool(pdl), slot_rows is not None, slot_bits, topk_bits, stages or STAGES,
                      ablate, gatherers or GATHERERS)
    gmem = cute.AddressSpace.gmem
    rows = slot_rows if slot_rows is not None else topk
    stream = cuda.CUstream(torch.cuda.current_stream(qcat.device).cuda_stream)
    fn(make_ptr(cutlass.BFloat16, qcat.data_ptr(), gmem, 16),
       make_ptr(cutlass.BFloat16, kv_cache.data_ptr(), gmem, 16),
       make_ptr(_int(topk_bits), topk.data_ptr(), gmem, 4),
       make_ptr(_int(slot_bits), token_slots.data_ptr(), gmem, 4),
       make_ptr(cutlass.Int64, rows.data_ptr(), gmem, 8),
       make_ptr(cutlass.Float32, part_o.data_ptr(), gmem, 16),
       make_ptr(cutlass.Float32, part_ml.data_ptr(), gmem, 8),
       m, splits, blocks, topk.stride(0), token_slots.stride(0), float(sm_scale) * LOG2E,
       stream)
