"""The weight ring both CuTe DSL kernels (fp8_mma, fp8_moe) are built on: a producer warp's TMA
loads into shared-memory slots, consumer warpgroups that take a CTA's units in rounds.

A CTA's units go in rounds of `groups` (one a consumer warpgroup), a round's slots interleaved
unit by unit in the order the producer loads them. Each consumer warpgroup has its own `per`
slots of the ring: an mbarrier's parity wait only tells its phase from the one before, so a
slot shared by turns would let a waiter that skipped the other's phase pass on the parity of
a phase two back (fp8_moe faulted that way at 16 rows on an H200 before b8d704c).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

BLOCK_M = 64  # weight rows a tile: wgmma's M
BLOCK_K = 128  # a slot's columns: one scale group


def mma_and_layouts(nx: int, a_tiles: int, b_tiles: int):
    """(the transposed e4m3 wgmma: weight tiles its 64 rows, x's nx rows its N; the ring's
    shared-memory layouts of a_tiles weight tiles and b_tiles x tiles), traced in the host
    function."""
    e4m3 = cutlass.Float8E4M3FN
    tile = (BLOCK_M, nx, BLOCK_K)
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        e4m3, e4m3, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, (1, 1, 1),
        tiler_mn=(BLOCK_M, nx))
    return (tiled_mma,
            sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile, e4m3, a_tiles),
            sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, e4m3, b_tiles))


def ring_state(stages: int, per: int, c, own, producer: bool):
    """Consumer warpgroup c's `own`-th slot (counted over its units) in its part of the ring
    (`count` holds `own`)."""
    phase = (own // per) % 2
    if producer:
        phase = 1 - phase  # the empty barriers start free
    return pipeline.PipelineState(stages, own, c * per + own % per, phase)


def round_slot(f, groups: int, chunk, my_units):
    """(the CTA's unit number, slot in the unit, consumer warpgroup, its own slot count) of
    the f-th slot the producer loads."""
    rnd = f // (groups * chunk)
    in_round = cutlass.min(groups, my_units - rnd * groups)
    f_in = f - rnd * groups * chunk
    c = f_in % in_round
    return rnd * groups + c, f_in // in_round, c, rnd * chunk + f_in // in_round


def owned(c, groups: int, units):
    """How many of a CTA's `units` consumer warpgroup c takes (round_slot's round-robin)."""
    return (units - c + groups - 1) // groups


def make_pipe(bars, stages: int, slot_bytes: int):
    """The ring's full/empty mbarriers: one TMA producer thread, the 4 warps of a consumer
    warpgroup release a slot."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=bars, num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
        tx_count=slot_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))


def group_mma(tiled_mma: cute.TiledMma, part: cute.Tensor, t_ra: cute.Tensor, a_slot,
              t_rb: cute.Tensor, b_slot) -> cute.TiledMma:
    """Issue part = weight tile a_slot x x's tile b_slot of the ring: one 128-column scale
    group on the asynchronous wgmma, overwriting part (the caller fences before, commits and
    waits after). Traced inline into the caller's kernel; it switches tiled_mma's accumulate
    field, so the caller rebinds what it returns (``tiled_mma = group_mma(tiled_mma, ...)``),
    which is how the DSL carries that field through the caller's loops."""
    tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
    for kb in range(cute.size(t_ra, mode=[2])):  # static: unrolled as the caller traces
        cute.gemm(tiled_mma, part, t_ra[(None, None, kb, a_slot)], t_rb[(None, None, kb, b_slot)],
                  part)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
    return tiled_mma


@cute.jit
def arrive(last: cute.Tensor, grp, t, counter, target):
    """A consumer warpgroup's arrival on a global counter after storing its part (release):
    last[grp] = 1 for the one that brings the count to `target` (it then reads the others'
    parts after a fence, and resets the counter)."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
    if t == 0:
        old = cute.arch.atomic_add(counter, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        last[grp] = cutlass.Int32(0)
        if old == target - 1:
            last[grp] = cutlass.Int32(1)
    cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
