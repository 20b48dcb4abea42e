"""The TP all-reduce and the residual add + RMSNorm after it, as one launch (DESIGN step 3).

On a TP shard a decode layer hands two sets of rows to the group's all-reduce: o_proj's, before
the post-attention norm, and the MLP's, before the next layer's first norm. Each all-reduce
is a launch of its own (upstream's), and the norm reading its output another. Here one
program a row does both, over peer-to-peer stores (NVLink on one node; no multicast):

1. push: the program stores its rank's row (bf16) into every rank's receive buffer, at its
   rank's place, then sets its flag there (a release at system scope) to the launch's epoch;
2. wait: it polls its own receive buffer's flags of that row, one a rank (acquire, system
   scope), until each holds the epoch;
3. it sums the ranks' rows in rank order in fp32, so every rank gets the same bits, and goes
   on as ``norm.add_rms_norm``: the sum rounded to bf16 plus the residual, RMSNorm, bf16
   and/or FP8 (one scale per 128 columns) out.

The epoch is the launch's number (1, 2, ...), counted on the device (``state[0]``, bumped by
the launch's last program), so a CUDA graph replays it; every rank runs the same sequence of
launches, so their epochs agree. The receive buffer and flags have two halves, by the epoch's
parity: a rank can be one launch ahead of a peer (its push of the next launch may land while
the peer still reads this one), never two, since its next launch waits for the peer's rows of
that one, which the peer pushes only after this launch has ended on its own stream. Flags
hold epochs and are never reset.

No wait is unbounded: one that outlasts SPIN_LIMIT polls gives up and sets the failure word
(``state[2]``: ``failed``), so a stalled rank makes every other rank's output wrong and says
so, never a hang. The peers' buffers are addressed through a table of their base addresses
(``PeerRows``: torch's symmetric memory on the GPU, ``symmetric_rows``; plain tensors of one
process under the interpreter, whose programs run one after another, so there the launch runs
as two, every rank's pushes first).

Not yet run on a GPU (written 2026-12-05 while no device was lent). The fused layers call it
where their all-reduce is a ``fused_decode.peer_reduce.PeerReduce`` (opt-in: the served model
still hands them upstream's all-reduce).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from . import overlap
from .arrival import arrive_last, wait_bounded
from .fp8_linear import interpreting
from .norm import NUM_WARPS, _add_rms_norm_values
from .overlap import stage_begin

# polls of one flag before a program gives up on a peer (seconds on an H200) and sets the
# failure word
SPIN_LIMIT = 1 << 24
# the launches under the interpreter, by PHASE (1: every rank's pushes, 2: the rest; 3, the
# GPU's one launch, would wait forever there)
INTERPRETER_PHASES = (1, 2)
STATE_WORDS = 4  # [epochs done, programs arrived, failure word, unused]


class PeerRows(NamedTuple):
    """One rank's view of the group's receive buffers.

    recv: this rank's bf16 [2, world, rows, H] (written by every rank, read here); flags: its
    int32 [2, world, rows]; recv_ptrs / flag_ptrs: int64 [world], every rank's recv / flags
    base address (this rank's included); state: int32 [STATE_WORDS], this rank's own, zeroed
    once before the first launch."""
    rank: int
    world: int
    recv: torch.Tensor
    flags: torch.Tensor
    recv_ptrs: torch.Tensor
    flag_ptrs: torch.Tensor
    state: torch.Tensor


def buffers(world: int, rows: int, hidden: int, device) -> tuple:
    """(recv, flags, state) of one rank, zeroed: the tensors a ``PeerRows`` names (on the
    GPU recv and flags must be symmetric memory: ``symmetric_rows``)."""
    return (torch.zeros(2, world, rows, hidden, dtype=torch.bfloat16, device=device),
            torch.zeros(2, world, rows, dtype=torch.int32, device=device),
            torch.zeros(STATE_WORDS, dtype=torch.int32, device=device))


def symmetric_rows(group, rows: int, hidden: int, device) -> PeerRows:
    """This rank's ``PeerRows`` over a torch.distributed group, its buffers in torch's
    symmetric memory (every rank calls it, in the same order: the rendezvous is collective)."""
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    recv = symm_mem.empty((2, world, rows, hidden), dtype=torch.bfloat16, device=device)
    flags = symm_mem.empty((2, world, rows), dtype=torch.int32, device=device)
    recv.zero_()
    flags.zero_()
    tables = []
    for t in (recv, flags):
        handle = symm_mem.rendezvous(t, group)
        tables.append(torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device))
    dist.barrier(group)  # every rank's zeroed flags before any rank's first push
    state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=device)
    return PeerRows(rank, world, recv, flags, tables[0], tables[1], state)


def failed(peers: PeerRows) -> bool:
    """Whether a wait of a launch so far gave up on a peer (syncs the host)."""
    return bool(peers.state[2].item())


@triton.jit
def _peer_norm_kernel(x_ptr, recv_ptrs, flag_ptrs, recv_ptr, flags_ptr, state_ptr, res_ptr,
                      w_ptr, out_ptr, res_out_ptr, xq_ptr, sx_ptr, M, ROWS, H, eps, RANK,
                      WORLD: tl.constexpr, HAS_RES: tl.constexpr, HAS_OUT: tl.constexpr,
                      QUANT: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
                      PDL: tl.constexpr, PHASE: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """Program m: row m's push, wait, sum and norm (the module docstring's steps; PHASE 1
    and/or 2)."""
    m = tl.program_id(0)
    stage_begin(PDL)
    done = tl.load(state_ptr, volatile=True)  # the previous launch bumped it before it ended
    epoch = done + 1
    half = done % 2
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    if PHASE % 2 == 1:
        row = tl.load(x_ptr + m * H + offs, mask=ok, other=0.0)
        for p in tl.static_range(WORLD):
            # (symmetric memory is 16-byte aligned: the row's stores vectorize)
            dst = tl.multiple_of(tl.load(recv_ptrs + p).to(tl.pointer_type(tl.bfloat16)), 16)
            tl.store(dst + ((half * WORLD + RANK) * ROWS + m) * H + offs, row, mask=ok)
        tl.debug_barrier()  # every thread's stores before the flags (cumulative release)
        for p in tl.static_range(WORLD):
            flag = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(flag + (half * WORLD + RANK) * ROWS + m, epoch, sem="release",
                           scope="sys")
    if PHASE >= 2:
        for s in tl.static_range(WORLD):
            wait_bounded(flags_ptr + (half * WORLD + s) * ROWS + m, epoch, state_ptr + 2,
                         SPIN_LIMIT, True, "sys")
        tl.debug_barrier()
        rows = recv_ptr + (half * WORLD * ROWS + m) * H + offs  # peers' stores: past L1
        x = tl.load(rows, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        for s in tl.static_range(1, WORLD):
            x += tl.load(rows + s * ROWS * H, mask=ok, other=0.0,
                         cache_modifier=".cg").to(tl.float32)
        _add_rms_norm_values(m, x, offs, ok, res_ptr, w_ptr, out_ptr, res_out_ptr, xq_ptr,
                             sx_ptr, H, eps, HAS_RES, HAS_OUT, QUANT, BLOCK, INTERPRET)
        if arrive_last(state_ptr + 1, M):  # the next launch's epoch
            tl.atomic_add(state_ptr, 1, sem="relaxed", scope="gpu")


def all_reduce_add_rms_norm(x: torch.Tensor, peers: PeerRows, residual: Optional[torch.Tensor],
                            weight: torch.Tensor, eps: float, out: Optional[torch.Tensor],
                            residual_out: torch.Tensor, out_q: Optional[torch.Tensor] = None,
                            out_s: Optional[torch.Tensor] = None) -> None:
    """``norm.add_rms_norm`` of the sum over the group's ranks of x (bf16 [M, H], this
    rank's rows), summed in rank order in fp32 and rounded once to bf16. Every rank of the
    group calls it with the same M, in the same order of launches."""
    call = (x, peers, residual, weight, eps, out, residual_out, out_q, out_s)
    if interpreting():
        if peers.world != 1:
            raise RuntimeError("under the interpreter the ranks' launches run phase by phase: "
                               "use run_ranks_interpreted")
        run_ranks_interpreted([call])  # a lone rank waits on nobody but itself
        return
    _launch(3, overlap.enabled(), *call)


def run_ranks_interpreted(calls: list) -> None:
    """Under the Triton interpreter: every rank's ``all_reduce_add_rms_norm`` (its argument
    tuple, one a rank), pushes first, then waits and norms, as the GPU's ranks would run them
    at once."""
    for phase in INTERPRETER_PHASES:
        for call in calls:
            _launch(phase, False, *call)


def _launch(phase, pdl, x, peers, residual, weight, eps, out, residual_out, out_q=None,
            out_s=None):
    m, h = x.shape
    rows = peers.recv.shape[2]
    if x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(f"all_reduce_add_rms_norm takes contiguous bf16 rows, got {x.dtype}")
    if (peers.recv.shape != (2, peers.world, rows, h)
            or peers.flags.shape != (2, peers.world, rows)):
        raise ValueError(f"all_reduce_add_rms_norm: receive buffers {tuple(peers.recv.shape)} "
                         f"and flags {tuple(peers.flags.shape)} do not fit {peers.world} ranks "
                         f"of {h} columns")
    if not 1 <= m <= rows:
        raise ValueError(f"all_reduce_add_rms_norm: {m} rows, the buffers hold 1..{rows}")
    if peers.recv_ptrs.numel() != peers.world or peers.flag_ptrs.numel() != peers.world:
        raise ValueError("all_reduce_add_rms_norm: one buffer address a rank")
    assert residual_out.is_contiguous() and 0 <= peers.rank < peers.world
    _peer_norm_kernel[(m,)](
        x, peers.recv_ptrs, peers.flag_ptrs, peers.recv, peers.flags, peers.state,
        residual if residual is not None else residual_out, weight,
        out if out is not None else residual_out, residual_out,
        out_q if out_q is not None else residual_out, out_s if out_s is not None else weight,
        m, rows, h, float(eps), peers.rank, WORLD=peers.world, HAS_RES=residual is not None,
        HAS_OUT=out is not None, QUANT=out_q is not None, BLOCK=triton.next_power_of_2(h),
        INTERPRET=interpreting(), PDL=pdl, PHASE=phase, SPIN_LIMIT=SPIN_LIMIT,
        num_warps=NUM_WARPS, **(overlap.launch_kw() if pdl else {}))
