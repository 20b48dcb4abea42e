"""What one persistent launch that streams a decode layer's weights ahead of its dependencies
would take at 1-16 rows (CuTe DSL, sm_90): the measurement DESIGN's kernel plan step 2 rests on.

The stage kernels leave HBM idle for most of a layer at one row (57 us against a 19.8 us
floor): each of a dozen dependent launches starts its loads only after its wait. Step 2 is
one resident CTA per SM whose producer warps stream every stage's weight tiles through shared
memory without waiting for activations, and whose consumers wait only where the math needs
the previous stage. Before any stage is written for it, this probe times that structure on a
layer's bytes:

- A layer is a list of stages, each a number of 64 x 128 e4m3 weight tiles (8 KB each, laid
  out one after another) cut into units of a few tiles. Units are numbered stage by stage;
  worker w (a CTA's consumer warpgroup, with its own producer warp and its own part of the
  ring) takes units w, w + W, w + 2W, ... (W workers). Deadlock-free with every CTA
  resident: the lowest unfinished unit's worker has finished its earlier units, and its
  producer streams only its own.
- Producer warp: for each of its worker's units, each tile into the next ring slot (TMA), with
  an 8-row x tile beside it. It waits for nothing but ring space, except in a *late* stage,
  whose bytes are chosen by the stage before (the routed experts by the router, the KV rows by
  the top-k): there it first waits for the previous stage's counter, as a real producer must.
- Consumer warpgroup: before a unit of a stage it has not yet entered, wait until the
  previous stage's counter holds all its units (one thread polls, acquire), then read a
  value the previous stage "produced" (an L2 round trip after the wait, as an activation
  read is); then the unit's wgmma (64 x 8 x 128 a tile, fp32) and its store, and one arrival
  on its stage's counter (release).

What it leaves out (so it is a lower bound for the stages' own work): the split-K sums and
quantization between stages, the norms', routing's and the attention's arithmetic. What it
keeps: every byte streamed through shared memory once, each dependency as a grid-wide count,
the late stages' loads after their dependency. Arms, in one run: ``chain`` (the dependencies),
``stream`` (none: the machinery's streaming rate), and the copy floor; how a dependency is
signalled and waited for is an `Arm`'s, which stages depend on which a `CONFIGS` entry's. A stack of LAYERS
layers (distinct bytes, several times the L2) is one launch; time per layer = launch / LAYERS.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.stream_chain_probe --out $OUT

Measured on H200s (4 layers; 19.6-19.7 us floor a layer; results/stream_chain_probe_*.json of
2026-12-04). Compare arms within one run: the first runs (T035233Z, T035521Z) had the chain at
46.1-47.5 us and the streaming at 26.8-28.0, the later ones (another machine, T071323Z ..
T082153Z) 53.0-54.0 and 32.0-33.4 for the same arms.
- The chain: 13 dependent stages take 1.6-1.7x the streaming. Every stage's bytes known
  ahead: -1.6..-3.4 us; the byte-less stages folded away (9 stages): -6..-8; both: -10
  (T035233Z, T071323Z).
- A dependency alone (one tile a stage, `hops_only`): 1.35-1.8 us with counters (the
  activation read after it: 0.06 us of that, T071323Z); 1.19 flagged (T073532Z). At full width
  (264 units a stage, `wide_hops`, T080818Z) 1.3 us a dependency with counters and 1.8
  flagged: each flagged consumer then polls a word of all 264 units.
- A unit's arrival (barrier, fence, release atomic) on its consumer's path costs the
  streaming most of its rate: 32.0-33.4 us a layer with it, 26.1-26.5 with the arrival
  handed to a signal warp, 23.1-23.6 without (83-85%), 23.1 with the signal warp and units of
  at least 16 tiles (85%; T071323Z .. T082153Z). The fence before the release atomic repeats the atomic's own release:
  without it the chain is 48.5-48.8 instead of 53.0-53.9 (T071700Z .. T082153Z, four runs).
- Flagged outputs instead of counters: the chain as slow (53.8-54.0 against 53.1-53.9); with the
  byte-less stages folded and every byte known ahead 39.5-39.7 against 42.8, 37.3 with each
  head's and expert's chain waiting for its own part (T073532Z, T080433Z). Per-part counters
  alone changed nothing (54.1 against 53.3, T071323Z).
- The layer's own dependencies (`dag`: the attention's rows known at the layer's start, the
  experts' weights waiting for the router only, down for its own expert, norms and sum
  folded): 53.5-55.1 us with counters, 48.0-50.7 flagged, 43.7-44.1 flagged with the
  experts known ahead (T075136Z .. T082153Z). The producer prefetching into L2 the unit 1, 2
  or 4 on in its sequence: slower, 53.2-54.8 against 49.0 (T080433Z).
So one launch a layer, written as this skeleton, costs 44-51 us a layer at one row before any
stage arithmetic: 39-45% of the floor, not the 70% bar. Its cost is per stage, not per byte:
13 stages of one 8 KB tile a worker (28 MB) take 34 us to stream with their arrivals, as long
as the whole layer's 84 MB (T080818Z).

With more rows the bytes grow (each row's KV rows, the routed experts the rows touch:
``at_rows``) and the stages do not, so the dependencies cost less of the layer. Per layer
(T114748Z, T114948Z; the one-row arms in the same runs at 53.7-54.0 us for the chain, 49.2-49.3
flagged dag, 43.7-44.1 known, as on the slower machine before), against the stage kernels'
MoE layer (decode_layer_20261203T225814Z: 57.0 / 84.1 / 114.4 / 135.4 / 158.1 us at 1 / 4 / 8 /
12 / 16 rows):

    rows  floor   stream  chain, no fence  dag flagged   dag known, flagged
      4    41.2    55.2       70.4             68.7 (60%)     63.9 (65%)
      8    65.7    72.9       94.4             92.8 (71%)     86.1 (76%)
     12    82.4    87.7      108.9            106.6 (77%)    103.5 (80%)
     16   106.8   111-112  135.7-136.6        127-135 (79-85%) 127-130 (82-85%)

The streaming alone is 75 / 90 / 94 / 95-96% of the floor at 4 / 8 / 12 / 16 rows (the
experts' stages are long enough that their arrivals no longer matter); at 16 rows counters on
the dag (no fence) take 144-147 us, more than flagged (16 rows' dag flagged: 132.0, 134.6 and,
in T120243Z, 126.6). So the skeleton's flagged dag is 15-32 us under the stage kernels at 4-16
rows (15-21%), and reaches the 70% bar from 8 rows, where the
stage kernels are at 58-68%.

The attention side alone as one launch (``ATTN_SIDE_DAG``: q_a|kv_a through o_proj and the
router, 7 stages, flagged; T120243Z, where the whole layer's dag took 48.7 us at one row and
126.6 at 16): 23.8 / 26.3 / 30.9 us at 1 / 8 / 16 rows (floors 9.6 / 13.5 / 17.9; streaming
alone 19.9 / 23.6 / 27.2), where the stage kernels' attention side, the first norm through
route, adds 36.0 us at one row and 56.3 at 16 (graph_timeline_20261203T230006Z). Most of what
one launch a layer saves at 16 rows (25 of its 24-32 us) is on the attention side: the
experts' stage kernels already stream at ~95% of their floor. (The KV rows stream here as
contiguous TMA tiles; the real ones are gathered, which sparse_mla does at ~73% of their
floor at 16 rows: sm90_attn_probe_20261204T114517Z.)
"""

from __future__ import annotations

import argparse
import functools
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup

from sgl_kernel_ext.nvidia.sm90 import ring

BLOCK_M, BLOCK_K = ring.BLOCK_M, ring.BLOCK_K
TILE_BYTES = BLOCK_M * BLOCK_K
NX = 8  # x rows a tile: wgmma's N (1-8 rows)
GROUPS = 2  # consumer warpgroups (and producer warps) a CTA, by default
OUT_ROWS = 4096  # units' outputs kept (a unit stores over u % OUT_ROWS)
SMEM_BYTES = 200 * 1024
SIGNALS = 8  # a worker's arrivals in flight to its signal warp
FLAG_BASE = 64  # flags[0]: the launch's epoch; then BLOCK_M flag words a unit


class Stage(NamedTuple):
    """A stage of a layer: `mb` MB of weights (or KV rows) streamed; `parts` independent
    pieces the math splits it into (heads, experts); `waits`: the stages its consumers wait
    for, as distances back (1: the stage before); `late`: the distance back of the stage that
    chooses its bytes (its producer waits for that one first; 0: bytes known ahead)."""
    name: str
    mb: float
    late: int = 0
    parts: int = 1
    waits: tuple = (1,)


# one TP8 rank's MoE layer (no indexer) at one row, in 8 KB tiles, as a chain: each stage
# waits for the one before. The norms and the sum stream nothing but are dependencies (one
# tile each); the attention's KV rows (2048 x 576 bf16) and the 9 experts' weights wait for
# the stage before them.
LAYER = (Stage("norm1", 0.0), Stage("q_a|kv_a", 16.12), Stage("latent", 0.0),
         Stage("q_b", 4.19, parts=8), Stage("absorb", 1.05, parts=8),
         Stage("attention", 2.36, late=1, parts=8), Stage("absorb_v", 1.05, parts=8),
         Stage("o_proj", 12.58, parts=8), Stage("norm2", 0.0), Stage("router", 3.15),
         Stage("gate_up", 28.31, late=1, parts=9), Stage("down", 14.16, late=1, parts=9),
         Stage("sum", 0.0))
# the same layer with the dependencies its math has: the attention's rows are the previous
# layer's top-k (known at the layer's start); the shared expert waits for the norm, not the
# router; the routed experts' weights (gate/up and down) wait for the router only; down waits
# for its own expert's gate/up; the norms fold into the stages after them (each unit
# computing its row's norm from the sums of squares), the terms' sum into the next layer's
# first stage (which waits for both downs).
LAYER_DAG = (Stage("q_a|kv_a", 16.12, waits=(1, 2)), Stage("q_b", 4.19, parts=8),
             Stage("absorb", 1.05, parts=8), Stage("attention", 2.36, parts=8),
             Stage("absorb_v", 1.05, parts=8), Stage("o_proj", 12.58, parts=8),
             Stage("shared", 3.15), Stage("router", 3.15, waits=(2,)),
             Stage("gate_up", 25.17, late=1, parts=8), Stage("shared_down", 1.57, waits=(3,)),
             Stage("down", 12.58, late=3, parts=8, waits=(2,)))

# the attention side alone as one launch (DESIGN step 2's first piece: from the first norm
# through o_proj and the router, the experts' stage kernels after it), LAYER_DAG's stages
ATTN_SIDE_DAG = (Stage("q_a|kv_a", 16.12), *LAYER_DAG[1:6], Stage("router", 3.15))

# routed experts M rows touch in the layer benchmarks (decode_layer's MoE runs count them)
EXPERTS_AT = {4: 26, 8: 46, 12: 59, 16: 79}


def at_rows(stages, rows: int):
    """The stages at `rows` rows: each row's KV rows, and gate/up's and down's bytes for
    EXPERTS_AT[rows] routed experts (plus the shared one where the stage holds it: LAYER's
    gate_up and down), one part each. The x tiles stay NX rows: the bytes, not the MMAs, are
    what is timed."""
    routed = EXPERTS_AT[rows]

    def scaled(st):
        if st.name == "attention":
            return st._replace(mb=rows * st.mb)
        if st.name in ("gate_up", "down"):
            experts = routed + (st.parts - 8)  # LAYER's 9 parts hold the shared expert
            return st._replace(mb=st.mb / st.parts * experts, parts=experts)
        return st
    return tuple(scaled(st) for st in stages)


def _whole(stages):
    """The stages with every dependency on the whole of the stages it names."""
    return tuple(st._replace(parts=1) for st in stages)


def _known(stages):
    """The stages with every stage's bytes known ahead (no late stage)."""
    return tuple(st._replace(late=0) for st in stages)


def _big(stages):
    """The chain's stages that stream bytes (the norms and the sum folded into their
    neighbours; each still waits for the one before it)."""
    return tuple(st for st in stages if st.mb > 0)


# the chain as it is; with every stage's bytes known ahead (no late stage: what speculating
# on the experts and the top-k would buy); without the byte-less stages; both; the
# dependencies alone (each stage one tile); "_parts": each head's (expert's) chain waiting
# only for its own head (expert) of the stage before, where the math allows; "dag": the
# layer's own dependencies (LAYER_DAG), with and without the parts, and with the experts'
# bytes known ahead
CONFIGS = {
    "layer": _whole(LAYER),
    "no_late": _whole(_known(LAYER)),
    "no_small": _whole(_big(LAYER)),
    "no_small_no_late": _whole(_known(_big(LAYER))),
    "hops_only": tuple(st._replace(mb=0.0, late=0, parts=1) for st in LAYER),
    "layer_parts": LAYER,
    "no_small_parts": _big(LAYER),
    "no_small_no_late_parts": _known(_big(LAYER)),
    "dag": LAYER_DAG,
    "dag_whole": _whole(LAYER_DAG),
    "dag_known": _known(LAYER_DAG),
    # 13 stages of one 8 KB tile a worker each (264 workers): the dependencies at full width
    "wide_hops": tuple(Stage(f"wide{i}", 264 * TILE_BYTES / 1e6) for i in range(13)),
    # at 4-16 rows (at_rows): the chain, the layer's own dependencies, its bytes known ahead
    **{f"{name}_{rows}": form(at_rows(stages, rows))
       for rows in EXPERTS_AT for name, stages, form in (
           ("layer", LAYER, _whole), ("dag", LAYER_DAG, lambda s: s),
           ("dag_known", LAYER_DAG, _known))},
    # the attention side alone (ATTN_SIDE_DAG) at 1, 8 and 16 rows
    "attn_dag": ATTN_SIDE_DAG,
    **{f"attn_dag_{rows}": at_rows(ATTN_SIDE_DAG, rows) for rows in (8, 16)},
}


class Arm(NamedTuple):
    """One timed form: `deps` False drops every wait (the streaming alone); `groups` consumer
    warpgroups a CTA; `act` False drops the activation read after each wait; units of at
    least `min_chunk` tiles; `arrive` False drops each unit's arrival (its barrier, fence and
    atomic; only without deps); `signal` True hands each arrival to a signal warp (an mbarrier
    ring) that does the fence and the atomic, so the consumer warpgroup goes on to its next
    unit; `fence` False drops the fence before the release atomic (which is itself a release:
    the fence only repeats it); `flagged` True replaces the counters by flagged outputs (as
    NCCL's LL protocol: each output word carries the launch's epoch, so a consumer polls the
    words it reads until they are current; no fence, no atomic, no counter, no separate read
    of the activation). A flagged consumer polls one word of every unit of the stage before
    it depends on (all, or its part's: the dependency the counters give) and the 64 words of
    one of them (its input slice); a late stage's producer warp polls the first. `l2_ahead`
    D > 0: before each unit's ring loads the producer prefetches into L2 (TMA prefetch) the
    tiles of its unit D units on in its sequence (about D stages on), unless that unit's bytes
    are late: the HBM stream runs ahead of the ring, which a consumer's wait fills."""
    config: str
    deps: bool = True
    groups: int = GROUPS
    act: bool = True
    min_chunk: int = 1
    arrive: bool = True
    signal: bool = False
    fence: bool = True
    flagged: bool = False
    l2_ahead: int = 0


# every arm has run on an H200 (2026-12-04: results/stream_chain_probe_20261204T035233Z ..
# T082153Z; each run's log, stream_chain_<commit>.log, names its arms; `--arms` picks some)
ARMS = [Arm("layer"), Arm("layer", deps=False), Arm("layer", groups=1), Arm("no_late"),
        Arm("no_small"), Arm("no_small_no_late"), Arm("no_small_no_late", groups=1),
        Arm("hops_only"), Arm("hops_only", groups=1), Arm("hops_only", act=False),
        Arm("layer", deps=False, min_chunk=16), Arm("layer", min_chunk=16),
        Arm("layer", deps=False, arrive=False), Arm("layer_parts"), Arm("no_small_parts"),
        Arm("no_small_no_late_parts"), Arm("layer", deps=False, signal=True),
        Arm("hops_only", fence=False), Arm("hops_only", signal=True), Arm("layer", signal=True),
        Arm("layer", signal=True, fence=False), Arm("no_small_no_late", signal=True, fence=False),
        Arm("layer", deps=False, signal=True, min_chunk=16), Arm("layer", fence=False),
        Arm("hops_only", flagged=True), Arm("layer", flagged=True),
        Arm("no_small_no_late", flagged=True), Arm("no_small", flagged=True),
        Arm("layer_parts", flagged=True), Arm("no_small_parts", flagged=True),
        Arm("no_small_no_late_parts", flagged=True), Arm("dag"), Arm("dag", flagged=True),
        Arm("dag_whole"), Arm("dag_whole", flagged=True), Arm("dag", fence=False),
        Arm("dag", deps=False), Arm("dag", flagged=True, min_chunk=16),
        Arm("dag", signal=True, fence=False), Arm("dag_known", flagged=True),
        Arm("dag", flagged=True, l2_ahead=1), Arm("dag", flagged=True, l2_ahead=2),
        Arm("dag", flagged=True, l2_ahead=4), Arm("layer", l2_ahead=2),
        Arm("no_small_no_late", flagged=True, l2_ahead=2), Arm("wide_hops"),
        Arm("wide_hops", flagged=True), Arm("wide_hops", deps=False),
        Arm("wide_hops", fence=False), Arm("layer_16", deps=False), Arm("layer_16"),
        Arm("layer_16", fence=False), Arm("dag_16", flagged=True), Arm("dag_16", fence=False),
        Arm("dag_known_16", flagged=True), Arm("dag_16", deps=False, signal=True, min_chunk=16),
        *(arm for rows in (4, 8, 12) for arm in (
            Arm(f"layer_{rows}", deps=False), Arm(f"layer_{rows}", fence=False),
            Arm(f"dag_{rows}", flagged=True), Arm(f"dag_known_{rows}", flagged=True))),
        *(arm for config in ("attn_dag", "attn_dag_8", "attn_dag_16") for arm in (
            Arm(config, flagged=True), Arm(config, deps=False), Arm(config, fence=False)))]


def stage_tiles(mb: float, parts: int = 1) -> int:
    """8 KB tiles of `mb` MB, a multiple of `parts` (at least one a part)."""
    tiles = max(1, round(mb * 1e6 / TILE_BYTES))
    return -(-tiles // parts) * parts


def arm_stages(arm: Arm) -> tuple:
    """(tiles, late, parts, waits) of each stage of the arm's config."""
    return tuple((stage_tiles(st.mb, st.parts), st.late, st.parts, st.waits)
                 for st in CONFIGS[arm.config])


class StreamChain:
    """One compiled chain: per stage (tiles, late, parts, waits), `layers` times, for one `Arm`.

    A stage of P parts is P equal runs of units; a unit of part p waits for part p of a stage
    it depends on where that stage has P parts too, else for all of it. Each part counts its
    units on its own counter. Dependencies reaching before the first stage are dropped."""

    def __init__(self, stages: tuple, layers: int, sms: int, arm: Arm):
        self.deps, self.act, self.groups = arm.deps, arm.act, arm.groups
        self.flagged = arm.flagged and arm.deps
        self.arrive = arm.arrive and not self.flagged  # flagged outputs need no arrival
        self.signal, self.fence = arm.signal and self.arrive, arm.fence
        self.l2_ahead = arm.l2_ahead
        assert arm.arrive or not arm.deps, "waits need the arrivals"
        assert 2 * arm.groups <= 4 or not arm.signal, "a producer and a signal warp a worker"
        workers = sms * arm.groups
        self.tiles, self.late, self.parts, self.chunk, self.per_part = [], [], [], [], []
        self.waits = []  # per stage: the stages (absolute) its consumers wait for
        for _ in range(layers):
            for tiles, late, parts, waits in stages:
                here = len(self.tiles)
                self.waits.append(tuple(here - d for d in waits if here - d >= 0))
                # the stage whose output chooses this one's bytes (-1: none)
                self.late.append(here - late if late and here - late >= 0 else -1)
                part_tiles = tiles // parts
                part_units = min(max(1, workers // parts), max(1, part_tiles // arm.min_chunk))
                chunk = -(-part_tiles // part_units)
                self.tiles.append(tiles)
                self.parts.append(parts)
                self.chunk.append(chunk)
                self.per_part.append(-(-part_tiles // chunk))  # units a part
        self.n_stages = len(self.tiles)
        self.units = [p * n for p, n in zip(self.parts, self.per_part)]
        self.unit_start = [sum(self.units[:s]) for s in range(self.n_stages)]
        self.tile_start = [sum(self.tiles[:s]) for s in range(self.n_stages)]
        self.counter_start = [sum(self.parts[:s]) for s in range(self.n_stages)]
        self.n_counters = sum(self.parts)
        self.total_units = sum(self.units)
        self.total_tiles = sum(self.tiles)
        self.slot_bytes = (BLOCK_M + NX) * BLOCK_K
        self.per = (SMEM_BYTES - 2048) // self.slot_bytes // arm.groups
        self.stages = self.per * arm.groups
        self.threads = 128 * (1 + arm.groups)

    def expected_counts(self) -> list:
        """What every counter holds after a launch: its part's units."""
        return [n for p, n in zip(self.parts, self.per_part) for _ in range(p)]

    @cute.jit
    def __call__(self, w: cute.Tensor, x: cute.Tensor, out: cute.Tensor, act: cute.Tensor,
                 counters: cute.Tensor, flags: cute.Tensor, grid: cutlass.Int32, stream):
        tiled_mma, a_layout, b_layout = ring.mma_and_layouts(NX, self.stages, self.stages)
        tma_a, tma_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w, cute.slice_(a_layout, (None, None, 0)),
            (BLOCK_M, BLOCK_K))
        tma_b, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), x, cute.slice_(b_layout, (None, None, 0)),
            (NX, BLOCK_K))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sig: cute.struct.MemRange[cutlass.Int64, SIGNALS * self.groups * 2]
            sa: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN,
                                                       cute.cosize(a_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN,
                                                       cute.cosize(b_layout)], 1024]

        self.storage = Storage
        self.kernel(tma_a, tma_w, tma_b, tma_x, tiled_mma, a_layout, b_layout, out, act,
                    counters, flags).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1],
                                     smem=Storage.size_in_bytes(), stream=stream)

    @cute.jit
    def _unit(self, u):
        """(stage, part, its counter, first tile, tiles) of unit u."""
        stage = cutlass.Int32(0)
        part = cutlass.Int32(0)
        first = cutlass.Int32(0)
        count = cutlass.Int32(0)
        for s in cutlass.range_constexpr(self.n_stages):
            if u >= self.unit_start[s]:
                i = u - self.unit_start[s]
                stage = cutlass.Int32(s)
                part = i // self.per_part[s]
                j = i - part * self.per_part[s]
                part_tiles = self.tiles[s] // self.parts[s]
                first = self.tile_start[s] + part * part_tiles + j * self.chunk[s]
                count = cutlass.min(self.chunk[s], part_tiles - j * self.chunk[s])
        return stage, part, self._counter(stage, part), first, count

    @cute.jit
    def _counter(self, stage, part):
        """The counter of `part` of `stage`."""
        index = cutlass.Int32(0)
        for s in cutlass.range_constexpr(self.n_stages):
            if stage == s:
                index = self.counter_start[s] + part
        return index

    @cute.jit
    def _is_late(self, stage):
        late = cutlass.Boolean(False)
        for s in cutlass.range_constexpr(self.n_stages):
            if cutlass.const_expr(self.late[s] >= 0):
                if stage == s:
                    late = cutlass.Boolean(True)
        return late

    def _targets(self, s: int, producer: bool) -> tuple:
        """The stages stage s's producer (its late bytes' chooser, if any) or consumers wait
        for."""
        if producer:
            return (self.late[s],) if self.late[s] >= 0 else ()
        return self.waits[s]

    def _by_part(self, w: int, s: int) -> bool:
        """Whether a unit of stage s waits only for its own part of stage w."""
        return self.parts[w] == self.parts[s] and self.parts[s] > 1

    @cute.jit
    def _poll(self, counters: cute.Tensor, index, need):
        """Poll counter `index` (acquire loads: polled by atomics, which serialize on the
        counter's line with the arrivals, the layer took 427 us instead of 47, results/
        stream_chain_probe_20261204T034853Z against T034948Z) until it holds `need`."""
        ptr = counters.iterator + index
        seen = cute.arch.load(ptr, cutlass.Int32, sem="acquire", scope="gpu")
        while seen < need:
            seen = cute.arch.load(ptr, cutlass.Int32, sem="acquire", scope="gpu")

    @cute.jit
    def _arrive(self, counters: cute.Tensor, index):
        """Count one unit on counter `index`, after every store the caller has ordered before
        (the warpgroup's, by its barrier)."""
        if cutlass.const_expr(self.fence):
            cute.arch.fence_acq_rel_gpu()
        cute.arch.atomic_add(counters.iterator + index, cutlass.Int32(1), sem="release",
                             scope="gpu")

    @cute.jit
    def _poll_flags(self, flags: cute.Tensor, stage, piece, u, epoch, lane,
                    lanes: cutlass.Constexpr, producer: cutlass.Constexpr):
        """Lanes 0..lanes-1 poll, until every one holds `epoch`, for each stage `stage` waits
        for: word 0 of each of its units that unit u (of part `piece`) needs (its part's or
        all), and, for a consumer, the BLOCK_M words of one of them (its input slice). Each
        round issues all of a lane's loads before checking any (one round trip)."""
        for s in cutlass.range_constexpr(1, self.n_stages):
            if stage == s:
                for w in cutlass.range_constexpr(len(self._targets(s, producer))):
                    prev = self._targets(s, producer)[w]
                    same = self._by_part(prev, s)
                    units = self.per_part[prev] if same else self.units[prev]
                    start = self.unit_start[prev] + (piece * units if same else 0)
                    words = units + (0 if cutlass.const_expr(producer) else BLOCK_M)
                    mine = start + (u - self.unit_start[s]) % units
                    ok = cutlass.Boolean(False)
                    while not ok:
                        ok = cutlass.Boolean(True)
                        for k in cutlass.range_constexpr(-(-words // lanes)):
                            i = lane + k * lanes
                            addr = (start + i) * BLOCK_M
                            if i >= units:
                                addr = mine * BLOCK_M + (i - units)
                            if i < words:
                                seen = cute.arch.load(flags.iterator + FLAG_BASE + addr,
                                                      cutlass.Int32, sem="relaxed", scope="gpu")
                                ok = ok & (seen == epoch)

    @cute.jit
    def _wait_count(self, counters: cute.Tensor, stage, part, producer: cutlass.Constexpr):
        """Wait until each stage `stage` waits for has counted the units `part` of it needs:
        its own part where both stages have the same parts, else every part."""
        for s in cutlass.range_constexpr(1, self.n_stages):
            if stage == s:
                for w in cutlass.range_constexpr(len(self._targets(s, producer))):
                    prev = self._targets(s, producer)[w]
                    base = self.counter_start[prev]
                    if cutlass.const_expr(self._by_part(prev, s)):
                        self._poll(counters, base + part, self.per_part[prev])
                    else:
                        for q in cutlass.range_constexpr(self.parts[prev]):
                            self._poll(counters, base + q, self.per_part[prev])

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mW: cute.Tensor, tma_b: cute.CopyAtom,
               mX: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               b_layout: cute.ComposedLayout, mOut: cute.Tensor, mAct: cute.Tensor,
               mCounters: cute.Tensor, mFlags: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        s_a = storage.sa.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        s_b = storage.sb.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        pipe = ring.make_pipe(storage.bars.data_ptr(), self.stages, self.slot_bytes)
        sig = pipeline.PipelineAsync.create(
            barrier_storage=storage.sig.data_ptr(), num_stages=SIGNALS * self.groups,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread))
        g_a = cute.local_tile(mW, (BLOCK_M, BLOCK_K), (None, None))
        g_b = cute.local_tile(mX, (NX, BLOCK_K), (None, None))
        t_sa, t_ga = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                           cute.group_modes(s_a, 0, 2), cute.group_modes(g_a, 0, 2))
        t_sb, t_gb = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                           cute.group_modes(s_b, 0, 2), cute.group_modes(g_b, 0, 2))
        workers = grid * self.groups
        epoch = mFlags[0]  # this launch's flag value (FLAG_BASE words on: units' outputs)
        if wg == 0:
            if warp < self.groups:  # producer warp `warp` streams for consumer warpgroup `warp`
                me = warp * grid + bidx
                own = cutlass.Int32(0)
                for u in cutlass.range(me, self.total_units, workers, unroll=1):
                    stage, piece, _, first, count = self._unit(u)
                    if cutlass.const_expr(self.l2_ahead > 0):
                        v = u + self.l2_ahead * workers
                        if v < self.total_units:
                            v_stage, _, _, v_first, v_count = self._unit(v)
                            if not self._is_late(v_stage):
                                with cute.arch.elect_one():
                                    for j in cutlass.range(v_count, unroll=1):
                                        cute.prefetch(tma_a, t_ga[(None, v_first + j, 0)])
                    if cutlass.const_expr(self.deps):
                        if self._is_late(stage):
                            if cutlass.const_expr(self.flagged):
                                self._poll_flags(mFlags, stage, piece, u, epoch,
                                                 cute.arch.lane_idx(), 32, True)
                            else:
                                self._wait_count(mCounters, stage, piece, True)
                    for j in cutlass.range(count, unroll=1):
                        put = ring.ring_state(self.stages, self.per, warp, own, True)
                        pipe.producer_acquire(put)
                        bar = pipe.producer_get_barrier(put)
                        cute.copy(tma_a, t_ga[(None, first + j, 0)], t_sa[(None, put.index)],
                                  tma_bar_ptr=bar)
                        cute.copy(tma_b, t_gb[(None, 0, 0)], t_sb[(None, put.index)],
                                  tma_bar_ptr=bar)
                        own = own + 1
            elif cutlass.const_expr(self.signal):
                if warp < 2 * self.groups:  # signal warp for consumer warpgroup warp - groups
                    if cute.arch.lane_idx() == 0:
                        c = warp - self.groups
                        n = cutlass.Int32(0)
                        for u in cutlass.range(c * grid + bidx, self.total_units, workers,
                                               unroll=1):
                            _, _, counter, _, _ = self._unit(u)
                            got = ring.ring_state(SIGNALS * self.groups, SIGNALS, c, n, False)
                            sig.consumer_wait(got)
                            self._arrive(mCounters, counter)
                            sig.consumer_release(got)
                            n = n + 1
        else:
            grp = wg - 1
            t = tidx % 128
            me = grp * grid + bidx
            thr_mma = tiled_mma.get_slice(t)
            t_ra = tiled_mma.make_fragment_A(thr_mma.partition_A(s_a))
            t_rb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
            coords = thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, NX)))
            acc = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            part = cute.make_rmem_tensor(coords.shape, cutlass.Float32)
            entered = cutlass.Int32(-1)
            scale = cutlass.Float32(1.0)
            own = cutlass.Int32(0)
            done = cutlass.Int32(0)  # units finished
            for u in cutlass.range(me, self.total_units, workers, unroll=1):
                stage, piece, counter, first, count = self._unit(u)
                if counter != entered:
                    if cutlass.const_expr(self.flagged):
                        self._poll_flags(mFlags, stage, piece, u, epoch, t, 128, False)
                        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                    elif cutlass.const_expr(self.deps):
                        if t == 0:
                            self._wait_count(mCounters, stage, piece, False)
                        cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                    if cutlass.const_expr(self.act):
                        scale = mAct[stage]  # the previous stage's output: after the wait
                    entered = counter
                acc.fill(0.0)
                for j in cutlass.range(count, unroll=1):
                    get = ring.ring_state(self.stages, self.per, grp, own, False)
                    pipe.consumer_wait(get)
                    warpgroup.fence()
                    tiled_mma = ring.group_mma(tiled_mma, part, t_ra, get.index, t_rb,
                                               get.index)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe.consumer_release(get)
                    for e in cutlass.range_constexpr(cute.size(acc)):
                        acc[e] = acc[e] + part[e] * scale
                    own = own + 1
                for e in cutlass.range_constexpr(cute.size(acc)):
                    if coords[e][1] == 0:  # one row's outputs
                        mOut[u % OUT_ROWS, coords[e][0]] = acc[e]
                        if cutlass.const_expr(self.flagged):
                            # an LL word would be (value, epoch) in one 8-byte store; the
                            # epoch alone costs the same latency
                            cute.arch.store(mFlags.iterator + FLAG_BASE + u * BLOCK_M
                                            + coords[e][0], epoch, sem="relaxed", scope="gpu")
                # the warpgroup's stores ordered before thread 0's (barrier), then one release
                # at gpu scope covers them all (cumulativity): one fence a unit, not 128
                if cutlass.const_expr(self.arrive):
                    cute.arch.barrier(barrier_id=1 + grp, number_of_threads=128)
                    if t == 0:
                        if cutlass.const_expr(self.signal):
                            # the barrier ordered the warpgroup's stores before this arrive
                            # (release, CTA scope); the signal warp's wait acquires them and
                            # its release at gpu scope is cumulative
                            put = ring.ring_state(SIGNALS * self.groups, SIGNALS, grp, done,
                                                  True)
                            sig.producer_acquire(put)
                            sig.producer_commit(put)
                        else:
                            self._arrive(mCounters, counter)
                done = done + 1


@functools.lru_cache(maxsize=None)
def compiled(arm: Arm, layers: int, sms: int):
    """(the chain, its compiled launch) of `arm`'s config, `layers` times."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    chain = StreamChain(arm_stages(arm), layers, sms, arm)
    dummy = (torch.empty(chain.total_tiles * BLOCK_M, BLOCK_K, dtype=torch.float8_e4m3fn),
             torch.empty(NX, BLOCK_K, dtype=torch.float8_e4m3fn),
             torch.empty(OUT_ROWS, BLOCK_M), torch.empty(chain.n_stages),
             torch.empty(chain.n_counters, dtype=torch.int32),
             torch.empty(FLAG_BASE + chain.total_units * BLOCK_M, dtype=torch.int32))
    fn = cute.compile(chain, *(from_dlpack(t, assumed_align=16) for t in dummy), sms,
                      cuda.CUstream(0))
    return chain, fn


def main() -> None:
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import from_dlpack

    from benchmark.gemv_probe import graph_time
    from benchmark.harness import measure_bandwidth, run_meta, write_json

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--out", default="")
    p.add_argument("--results", default="benchmark/results")
    p.add_argument("--arms", default="", help="indices into ARMS, comma-separated (all)")
    args = p.parse_args()
    arms = [ARMS[int(i)] for i in args.arms.split(",")] if args.arms else ARMS
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = measure_bandwidth(dev)
    rows = []
    for arm in arms:
        stages = arm_stages(arm)
        layer_bytes = sum(st[0] for st in stages) * TILE_BYTES
        floor_us = layer_bytes / bw * 1e6
        chain, fn = compiled(arm, args.layers, sms)
        # bytes 0x00-0x7e: finite e4m3 of either magnitude, never NaN (0x7f, 0xff)
        w = torch.randint(0, 0x7F, (chain.total_tiles * BLOCK_M, BLOCK_K), device=dev,
                          dtype=torch.uint8).view(torch.float8_e4m3fn)
        x = torch.randn(NX, BLOCK_K, device=dev).to(torch.float8_e4m3fn)
        out = torch.zeros(OUT_ROWS, BLOCK_M, device=dev)
        acts = torch.ones(chain.n_stages, device=dev)
        counters = torch.zeros(chain.n_counters, dtype=torch.int32, device=dev)
        flags = torch.zeros(FLAG_BASE + chain.total_units * BLOCK_M, dtype=torch.int32,
                            device=dev)
        targs = [from_dlpack(t, assumed_align=16)
                 for t in (w, x, out, acts, counters, flags)]

        def launch(_):
            counters.zero_()
            flags[:1].add_(1)  # a new epoch: the flags of the launch before are stale
            fn(*targs, sms, cuda.CUstream(torch.cuda.current_stream().cuda_stream))

        launch(0)
        torch.cuda.synchronize()
        if chain.flagged:  # every unit's words hold the epoch
            assert bool((flags[FLAG_BASE:] == flags[0]).all()), "a unit's flags not written"
        elif chain.arrive:
            expected = torch.tensor(chain.expected_counts(), dtype=torch.int32, device=dev)
            assert torch.equal(counters, expected), (counters.tolist(), expected.tolist())
        assert torch.isfinite(out).all()
        us = graph_time(launch, 1) / args.layers
        rows.append({**arm._asdict(), "arm": "chain" if arm.deps else "stream",
                     "act_read": arm.act, "us_per_layer": us, "floor_us": floor_us,
                     "frac_floor": floor_us / us, "stages_per_layer": len(stages),
                     "late_stages": sum(bool(st[1]) for st in stages),
                     "parts": [st[2] for st in stages],
                     "layer_bytes": layer_bytes, "ring_slots": chain.stages})
        print(f"{arm.config:22s} {rows[-1]['arm']:6s} g{arm.groups} act{int(arm.act)} "
              f"c{arm.min_chunk:<2d} arrive{int(arm.arrive)} sig{int(arm.signal)} "
              f"fence{int(arm.fence)} ll{int(arm.flagged)} l2+{arm.l2_ahead} {us:7.2f} us a layer  floor "
              f"{floor_us:5.2f}  {floor_us / us:6.1%}  ({len(stages)} stages)", flush=True)
    meta = {"benchmark": "stream_chain_probe", **run_meta(dev), "bandwidth_TBps": bw / 1e12,
            "layers": args.layers, "nx": NX,
            "configs": {k: [st._asdict() for st in v]
                        for k, v in CONFIGS.items()}}
    write_json("stream_chain_probe", {"meta": meta, "results": rows}, [args.out, args.results])


if __name__ == "__main__":
    main()
