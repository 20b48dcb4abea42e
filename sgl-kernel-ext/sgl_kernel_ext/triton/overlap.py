"""Overlap of consecutive stage kernels: programmatic dependent launch and L2 prefetch.

A decode layer is a chain of small kernels, each far too short to reach HBM bandwidth on its
own: launch latency, the first loads' latency and the tail of the previous kernel dominate.
With programmatic dependent launch (Hopper and later) kernel N+1 is scheduled while kernel N
still runs; its programs first prefetch into L2 the bytes they will read that no kernel of
the chain is still writing (weights; rows chosen by a stage two or more kernels back), then
block in ``stage_begin`` until kernel N has finished and its writes are visible.

The rule each kernel of the chain follows (so any number of them can be in flight):
  1. before ``stage_begin``: reads only of data written two or more kernels back (kernel
     N+1 starts once kernel N has passed its own ``stage_begin``, so everything before
     kernel N is complete), and writes only where no kernel still in flight reads or writes
     (gate/up's shared expert, ``moe.SHARED_BEFORE_WAIT_FROM_ROWS``);
  2. ``stage_begin``: wait for the previous kernel, then let the next one launch.

One kernel waits otherwise: a MoE layer's down with slot waits (``moe.SlotWait``) polls
gate/up's per-slot counters instead of waiting for gate/up's grid, so its end implies the end
of gate/up's programs of the slot list only; gate/up's programs past the list write nothing
once they have let down launch, and the kernels after down read nothing of gate/up's.

Everything here is a compile-time no-op unless the kernel is compiled with ``PDL=True``,
which ``enabled()`` allows only on NVIDIA sm_90+ outside the interpreter: the stage kernels
keep one portable source, and another backend passes ``PDL=False``.
"""

from __future__ import annotations

import contextlib
import functools
import os

import triton
import triton.language as tl

try:  # Triton >= 3.3 on NVIDIA
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton or another backend
    gdc_launch_dependents = gdc_wait = None

ENV = "SGL_KERNEL_EXT_PDL"  # "0" turns the overlap off (for A/B timing and debugging)
# The forms whose programs load what their predecessors do not write (norm weights, routing's
# bias, positions and slots) before their wait: norm.W_EARLY_MAX_ROWS (off by default),
# mla.LATENT_W_EARLY_MAX_ROWS, moe.ROUTE_CONSTS_EARLY and indexer.PREPARE_EARLY (on), read
# as those modules are imported. This variable, where set, overrides all four: "1" on, "0" off.
WEIGHTS_EARLY_ENV = "SGL_KERNEL_EXT_WEIGHTS_EARLY"


def weights_early(default: bool) -> bool:
    """An early-load form's setting: `default` unless WEIGHTS_EARLY_ENV says "1" or "0"."""
    value = os.environ.get(WEIGHTS_EARLY_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{WEIGHTS_EARLY_ENV}={value!r}: expected 1 (on) or 0 (off)")
    return default if value == "" else value == "1"


# Whether a layer's first kernel also prefetches the weights of its later dense stages (q_a,
# kv_a, q_b, kv_b, o_proj, the router, the shared expert) into L2, so HBM streams them while
# the layer's latency-bound kernels run (``layer_regions``, ``prefetch_table``), and whether
# its second norm prefetches the next layer's (NEXT_LAYER_PREFETCH). Off: on an H200 they
# cost a layer up to 7 us each (10 together) at 1-4 rows and nothing at 16 (the overlap is off
# there), even spread over one program per SM (results/tiling_probe_20261130T170454Z; from
# one program per row, up to 212 us each, tiling_probe_20261130T164019Z).
# Again at 6c97f3d (every stage kernel overlapped; tiling_probe_20261203T175456Z):
# LAYER_PREFETCH +2.0..+5.5 us a layer at 1-16 rows, NEXT_LAYER_PREFETCH +1.6..+3.6, every
# kind. Tried too: absorb's programs prefetching only what runs after the attention (o_proj;
# the router and the shared expert), where HBM reads only the attention's few KV rows: +0.6 us
# a MoE layer at one row, +1.9..+7.8 at 2-16, +2.0..+3.5 on the other kinds (mid_prefetch_16;
# with o_proj's own prefetch on too, worse; code at 6c97f3d). A region table's prefetches
# delay the critical path's loads more than they save later.
LAYER_PREFETCH = False
NEXT_LAYER_PREFETCH = False
# bytes per bulk prefetch request of a region table (a multiple of 16)
REGION_BYTES = 64 << 10
# Steps of more rows run without the overlap: on an H200 it saved 4-8% of a MoE layer at 1-4
# rows, was neutral at 8 and cost ~3% at 16 (decode_layer_20261130T111515Z vs ..T111614Z;
# again 6% at 16: tiling_probe_20261130T152855Z, overlap_16). With the stage kernels' reads
# moved before their waits since (and the experts still outside it, WIDE_MAX_ROWS), the
# overlap up to 16 rows makes a MoE layer 3.8 us faster at 16 rows and 4.9 at 12
# (tiling_probe_20261203T095928Z: overlap_16_narrow), every kind 2.6-9.8 us at 9-16 rows
# (T100456Z: overlap_to_8).
MAX_ROWS = 16
# The same bound for the MoE's expert kernels (gate/up, down and its sum, launched inside
# ``wide()``): with more rows they run many waves of programs, and a dependent kernel's
# programs made resident early hold multiprocessors their later waves need. On an H200 the
# overlap off for them from 5 rows is 7.0-8.2 us faster a MoE layer at 8 rows (1.0-1.2
# dense), and from 3 rows 3.5-5.1 us faster a layer at 4 (from 2: dense -4.8 us at 2 rows,
# MoE +0.6..+1.2); with the other kernels overlapped at 16 rows too, a layer is within
# -0.4..+0.4 us at 16 (dense +3.3); all of them overlapped at 16, +7..12
# (tiling_probe_20261201T121017Z: overlap_16*; T121440Z: overlap_wide_to_*).
# Again with the narrow kernels overlapped to 16 rows: the experts' too are 2.4-10.6 us
# slower a layer at 8-16 rows, every kind (tiling_probe_20261203T105205Z: overlap_16).
WIDE_MAX_ROWS = 2
# Per expert kernel ("gate_up", the dense MLP's "dense_gate_up", "down", "sum":
# ``wide_kernel``), a bound that replaces WIDE_MAX_ROWS for it alone. A kernel launched
# without the overlap still lets the next one, if overlapped, launch as its programs drain
# (the implicit trigger at their exit), and only a dependent kernel's early programs take
# multiprocessors from the kernel before it. Route is one wave of programs, and down,
# launched plainly, lets the sum launch only as its last programs exit: a MoE layer's gate/up
# and the sum of down's terms overlap at every row count, down (after gate/up's many waves)
# not. On an H200 at 4-16 rows the pair makes a MoE layer 0.5-1.5 us faster, the
# sum alone every kind 0.2-0.7, down overlapped too 5.8-15.1 us slower, the dense MLP's
# gate/up overlapped +0.3-0.5 (tiling_probe_20261203T123511Z: *_overlap_16). Down, once it
# no longer prefetches its tile before its wait (PREFETCH_OFF), is 0.5-2.0 us faster
# overlapped at 3-12 rows, every kind, and 0.5-1.0 slower at 16 (T160304Z, T160431Z).
# A MoE layer's down from moe.DOWN_SLOT_WAIT_FROM_ROWS rows launches dependent at any row
# count (``pdl_possible``) and waits per slot on gate/up's counters, not for the whole grid:
# the "down" bound here then serves only the dense MLP and the slot waits turned off.
WIDE_KERNEL_MAX_ROWS: dict = {"gate_up": MAX_ROWS, "sum": MAX_ROWS, "down": 12}
# Stage kernels (by name) whose programs do not prefetch their weight tiles into L2 before
# their wait; every other one does, with the overlap on: "fp8_linear" (q_a|kv_a, q_b from 3
# rows, o_proj), "q_b_normed", "bf16_linear", "router", "absorb", "absorb_v", "gate_up" (its
# shared-expert or dense programs) and "down". Down's many programs each issued their tile as
# many small bulk requests, all but the first wave's just before loading the same bytes: on
# an H200 down without its prefetch is 0.6-1.9 us faster a layer at 1-2 rows (where it was
# overlapped) and, overlapped without it, 0.5-2.0 faster at 3-12 rows, every kind, where
# with it overlapped it was 3.1-13.9 slower (tiling_probe_20261203T160304Z, T160431Z;
# T155614Z); gate/up without its prefetch is mixed (dense -0.2..-0.8 us at 1-2 rows, MoE
# +0.1..+0.4; T161356Z). Timed one by one (each against the defaults then, T174617Z,
# T174728Z): fp8_linear without its prefetch is 0.3-1.9 us faster a layer at 2-16 rows on every
# kind and at one row on the layers with the indexer and dense (-0.7), +0.3 on a MoE layer at
# one row (within its noise); q_b_normed, bf16_linear, router, absorb, absorb_v and gate/up
# without theirs are mixed, mostly within noise (the router's and absorb's +0.6..+1.1 at one row,
# MoE), and all of them off +2.0 on a MoE layer at one row. Tried, not faster: gate/up and
# down letting their successor launch only at their programs' end, not after their wait
# (+0.0..+2.3 us a layer at 4-16 rows without down's prefetch, T160304Z; code at c6b149d).
PREFETCH_OFF: frozenset = frozenset({"down", "fp8_linear"})
PREFETCH_KERNELS = ("fp8_linear", "q_b_normed", "bf16_linear", "router", "absorb", "absorb_v",
                    "gate_up", "down")
# rows of the step being launched (0: outside a layer step); one launching thread per process
_rows = [0]
_wide = [""]


@contextlib.contextmanager
def step_rows(m: int):
    """Launch the enclosed kernels as a step of m rows (the overlap only up to MAX_ROWS)."""
    prev, _rows[0] = _rows[0], m
    try:
        yield
    finally:
        _rows[0] = prev


@contextlib.contextmanager
def wide(kernel: str = "experts"):
    """Launch the enclosed kernels as wide ones (the overlap only up to WIDE_MAX_ROWS, or
    the kernel's own bound in WIDE_KERNEL_MAX_ROWS; never past MAX_ROWS)."""
    prev, _wide[0] = _wide[0], kernel
    try:
        yield
    finally:
        _wide[0] = prev


def wide_kernel(kernel: str):
    """Inside ``wide()``: launch the enclosed kernels as the wide `kernel`; outside, nothing."""
    return wide(kernel) if _wide[0] else contextlib.nullcontext()


def wide_launcher(kernel):
    """Decorator: the launcher's kernels launch inside ``wide_kernel(name)``, name the
    string `kernel` or what `kernel` returns for the launcher's arguments."""
    def wrap(fn):
        @functools.wraps(fn)
        def launch(*args, **kwargs):
            with wide_kernel(kernel if isinstance(kernel, str) else kernel(*args, **kwargs)):
                return fn(*args, **kwargs)
        return launch
    return wrap


def enabled() -> bool:
    """Whether kernels launched now use programmatic dependent launch and L2 prefetch."""
    bound = MAX_ROWS
    if _wide[0]:
        bound = min(bound, WIDE_KERNEL_MAX_ROWS.get(_wide[0], WIDE_MAX_ROWS))
    return _rows[0] <= bound and pdl_possible()


@functools.lru_cache(maxsize=None)
def supported() -> bool:
    """Whether this process can use the overlap at all (NVIDIA sm_90+, Triton with GDC)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if gdc_wait is None:
        return False
    try:
        import torch

        if not torch.cuda.is_available() or torch.version.cuda is None:
            return False
        return torch.cuda.get_device_capability()[0] >= 9
    except Exception:  # pragma: no cover
        return False


def pdl_possible() -> bool:
    """Whether a launch can be programmatically dependent here at all (whatever the row
    bounds): for a kernel whose own waits make it sound at every row count."""
    return os.environ.get(ENV, "1") != "0" and supported()


def prefetches(kernel: str) -> bool:
    """Whether the named stage kernel's programs prefetch before their wait (PREFETCH_OFF)."""
    unknown = set(PREFETCH_OFF) - set(PREFETCH_KERNELS)
    if kernel not in PREFETCH_KERNELS or unknown:
        raise ValueError(f"no stage kernel named {sorted(unknown) or kernel!r} prefetches; "
                         f"the names: {', '.join(PREFETCH_KERNELS)}")
    return kernel not in PREFETCH_OFF


def launch_kw() -> dict:
    """Extra keyword arguments of a stage kernel's launch."""
    return {"launch_pdl": True} if enabled() else {}


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    """Let the next kernel launch now, before this one waits (``stage_begin`` lets it only
    after the wait). Only for a kernel whose successor reads nothing before its own wait that
    this kernel's predecessor may still be writing: that successor then starts while this
    kernel's predecessor can still run."""
    if PDL:
        gdc_launch_dependents()


# Where it pays: absorb -> the attention (mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS), whose
# gather is real work before its wait. Tried and not kept (code at e5420c7; the outputs
# bitwise the late launch's, results/pytest_early_deps_e5420c7.log): the layer's first norm
# letting q_a|kv_a or attn_side launch early, +0.5 us a MoE layer at one row, 0 elsewhere; its
# norm after the attention letting the router launch early, +0.3..+2.4 us at 1-16 rows; route's
# per-row programs letting gate/up launch early, within noise at 1-16 rows
# (tiling_probe_20261204T212844Z, two pairs each: norm1_, norm2_, route_early_dependents).


@triton.jit
def launch_dependents_after(v, PDL: tl.constexpr):
    """Let the next kernel launch once v (an fp32 scalar this program computed) is ready, so
    the loads it was derived from have completed before the next kernel's early traffic (its
    weight stream before its wait) competes with them. Only after ``gdc_wait``."""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents;\n mov.b32 $0, $1;",
                                  "=r,r", [v.to(tl.int32, bitcast=True)], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def stage_wait(PDL: tl.constexpr):
    """Wait until the previous kernel of the stream has finished (its writes visible), without
    letting the next one launch (``launch_dependents`` or ``launch_dependents_after`` does)."""
    if PDL:
        gdc_wait()


@triton.jit
def stage_begin(PDL: tl.constexpr):
    """Wait until the previous kernel of the stream has finished (its writes visible), then
    allow the next one to launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, nbytes, mask, PDL: tl.constexpr):
    """Bulk-prefetch nbytes (a multiple of 16) from each 16-byte aligned address in ptrs
    where mask holds into L2. A hint: nothing is written, nothing waits for it."""
    if PDL:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0;\n"
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptrs, nbytes, mask.to(tl.int32)], dtype=tl.int32, is_pure=False,
            pack=1)


@triton.jit
def prefetch_rows(base_ptr, row0, rows, n_rows, stride, col0, cols, PDL: tl.constexpr,
                  ROWS: tl.constexpr, SEGS: tl.constexpr):
    """Prefetch cols bytes from col0 of the rows [row0, row0 + rows) (< n_rows) of a
    row-major byte matrix with the given row stride, as ROWS x SEGS bulk requests (one per
    thread at most, so no request is issued twice). cols must be a multiple of 16 * SEGS."""
    if PDL:
        r = row0 + tl.arange(0, ROWS)
        seg = cols // SEGS
        s = tl.arange(0, SEGS)
        ptrs = base_ptr.to(tl.pointer_type(tl.int8)) + r[:, None].to(tl.int64) * stride \
            + col0 + s[None, :] * seg
        ok = (r[:, None] < row0 + rows) & (r[:, None] < n_rows) & (s[None, :] < SEGS) & (seg > 0)
        prefetch_l2(ptrs, seg, ok, PDL)


@triton.jit
def prefetch_table(table_ptr, n, first, step, PDL: tl.constexpr, BLOCK: tl.constexpr):
    """Prefetch into L2 the regions first, first + step, first + 2 * step, ... (< n) of a
    table of int64 (address, bytes) pairs, BLOCK at a time: one bulk request per region (a
    hint, as ``prefetch_l2``). A launch spreads a table over its programs with first = the
    program's index and step = the number of programs: one SM's copy engine streams only a
    small share of HBM bandwidth, so a table issued from a few programs takes far longer
    than its bytes (a whole table from one program: up to +212 us a layer,
    results/tiling_probe_20261130T164019Z)."""
    if PDL:
        for j0 in range(0, tl.cdiv(n - first, step), BLOCK):
            i = first + (j0 + tl.arange(0, BLOCK)) * step
            ok = i < n
            addr = tl.load(table_ptr + 2 * i, mask=ok, other=0)
            size = tl.load(table_ptr + 2 * i + 1, mask=ok, other=0)
            prefetch_l2(addr.to(tl.pointer_type(tl.int8)), size.to(tl.int32), ok & (size > 0),
                        PDL)


def prefetch_programs(device) -> int:
    """Programs a launch that prefetches a region table should have: one per SM."""
    import torch

    return _sm_count(torch.device(device).index or 0)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def region_table(tensors, device, chunk: int = 0):
    """int64 [n, 2] (address, bytes) of the tensors' bytes in chunks of at most `chunk` (a
    multiple of 16; default REGION_BYTES), for ``prefetch_table``. The tensors must stay
    where they are (weights): the table holds raw addresses. A non-contiguous tensor is left
    out (a prefetch is only a hint)."""
    import torch

    chunk = chunk or REGION_BYTES
    rows = []
    for t in tensors:
        if t is None or t.numel() == 0 or not t.is_contiguous():
            continue
        base, nbytes = t.data_ptr(), t.numel() * t.element_size()
        for off in range(0, nbytes - nbytes % 16, chunk):
            rows.append((base + off, min(chunk, nbytes - nbytes % 16 - off)))
    return torch.tensor(rows or [(0, 0)], dtype=torch.int64, device=device)
