"""Last-arrival tails: the program of a group that finishes last does the group's reduction.

A stage whose output is summed over split-K partials (or over MoE slots) needs every partial
before its consumer can run; as a separate kernel that consumer costs a launch and its ramp,
several microseconds at 1-4 rows. Instead each program of a group counts its arrival on a
counter in global memory after its stores; the one that sees the count reach the group's size
knows every partial is written and visible, runs the reduction itself and resets the counter
to zero, so the next launch (or CUDA-graph replay) finds it zeroed without a host write.

The reduction reads the partials in a fixed order, so results do not depend on which program
arrives last: deterministic, and bitwise the same as the separate kernel. Portable Triton
(atomics with memory semantics), no vendor intrinsics.

``arrive`` and ``wait_for`` are the same counter used as a barrier among a launch's programs
(the one-launch split top-k's rows): only sound where every program of the group is resident
at once, which the caller must guarantee (a waiting program holds its multiprocessor).
``wait_bounded`` is the wait that gives up: after a limit of polls it sets a failure word and
returns, so a broken guarantee leaves wrong output and a flag the host can read, not a hang.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def arrive_last(counter_ptr, group_size):
    """Count this program's arrival (after all its threads' stores); True in the one program
    of the group that arrives last, which then sees every other arrival's stores."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == group_size - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def arrive(counter_ptr):
    """Count this program's arrival (after all its threads' stores; release)."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def wait_for(counter_ptr, target):
    """Spin until the counter reaches target (acquire): the arrivals' stores are then visible
    to loads that bypass L1 (``cache_modifier=".cg"``)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _unmet(seen, target, EXACT: tl.constexpr):
    if EXACT:
        return seen != target
    else:
        return seen < target


@triton.jit
def wait_bounded(counter_ptr, target, failed_ptr, LIMIT: tl.constexpr, EXACT: tl.constexpr,
                 SCOPE: tl.constexpr):
    """Poll a counter (acquire, SCOPE "gpu" or "sys") until it reaches target (EXACT: until it
    holds target, as an epoch flag does), or give up after LIMIT polls and set the failure
    word. No barrier: the caller orders its threads' loads after it."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope=SCOPE)
    polls = 0
    while _unmet(seen, target, EXACT) & (polls < LIMIT):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope=SCOPE)
        polls += 1
    if _unmet(seen, target, EXACT):
        tl.atomic_xchg(failed_ptr, 1, sem="relaxed", scope="gpu")


def counters(n: int, device) -> torch.Tensor:
    """n zeroed arrival counters (each tail leaves its counter at zero again)."""
    return torch.zeros(max(1, n), dtype=torch.int32, device=device)
