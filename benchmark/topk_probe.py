"""Time the indexer's exact top-k forms alone, on long rows, and check each against torch.

For each (rows, width): fp32 scores (random normal, every row's context the whole width; with
--table T, rows T wide, as a server's slot table, whose contexts are the widths), then each
form's CUDA-graph replays (median us), its output checked whole against a stable torch sort
(ascending positions of the k best, the lowest-positioned ties first, -1 padded) after
poisoning it. Forms:

    split            topk_positions_split, six launches (the default past SPLIT_MIN_WIDTH)
    one_launch       the same as one launch (topk.ONE_LAUNCH), where its programs fit at once
    row_B_W          topk_positions: one program a row, B scores a loop step, W warps
    once_B_W_D       one program a row holding its B >= width keys in registers from one load,
                     digits of D bits (8: four passes, 11: three), W warps (``_once_kernel``)
    cluster          nvidia/sm90/cluster_topk: a thread block cluster a row, one launch
    cluster_pull     the same, its CTAs reading each other's histograms after cluster barriers
                     (cluster_topk.PUSH off)
    cluster_sized    the same, a context held in registers walking only its share of a
                     thread's keys, 4, 8, 16 or 32 (cluster_topk.SIZED on)
    cluster_no_prefetch  the same, a context loaded again each pass loading each tile when
                     its turn comes (cluster_topk.PREFETCH off)
    cluster_prefetch_all the same, the next tile prefetched at as many rows as the GPU
                     holds clusters of 8 at one CTA an SM (PREFETCH_ROWS unbounded)
    cluster_sizes_4_8    the same, 4, 8 or 32 keys (SIZED on, HELD_SIZES 4, 8)
    cluster_no_skip  the same, a thread's count walking every key group it holds, predicated
                     off past its share (cluster_topk.SKIP off)
    cluster_skip_count_only the same, only a held context's count skipping, its tally and
                     write not, a reloaded one's count too (SKIP_WRITE off, SKIP_RELOADED on:
                     the form before 144e264)
    cluster_8        the same, 8 CTAs a row at any rows (WIDE_CLUSTER 8; the default takes
                     16 in a table wider than 64K at up to WIDE_CLUSTER_ROWS rows)
    cluster_unrolled the same, the four passes unrolled (ROLL off; on, a loop up to ROLL_ROWS)
    cluster_rolled_16 the same up to 16 rows, two CTAs an SM where the rows' clusters do not
                     fit at one (ROLL_ROWS 16)
    cluster_prefetch_8 the same, the prefetching rolled form up to 8 rows, unrolled past
                     (PREFETCH_ROWS 8: the form before 15 rows, an H100's clusters of 8 at
                     one CTA an SM; measured at 0d214db as cluster_prefetch_15 against it)

    PYTHONPATH=python:sgl-kernel-ext python3 -m benchmark.topk_probe --out $OUT
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton.topk import _keys, _take_whole_context

# the cluster forms: the cluster_topk knobs each sets ({}: the default)
CLUSTER_FORMS = {"cluster": {}, "cluster_pull": {"PUSH": False},
                 "cluster_sized": {"SIZED": True}, "cluster_no_prefetch": {"PREFETCH": False},
                 "cluster_prefetch_all": {"PREFETCH_ROWS": 1 << 30},
                 "cluster_sizes_4_8": {"SIZED": True, "HELD_SIZES": (4, 8)},
                 "cluster_no_skip": {"SKIP": False},
                 "cluster_skip_count_only": {"SKIP_WRITE": False, "SKIP_RELOADED": True},
                 "cluster_8": {"WIDE_CLUSTER": 8}, "cluster_unrolled": {"ROLL": False},
                 "cluster_rolled_16": {"ROLL_ROWS": 16},
                 "cluster_prefetch_8": {"PREFETCH_ROWS": 8}}

from . import harness as H


@triton.jit
def _once_digit(key, in_row, prefix, need, P: tl.constexpr, D: tl.constexpr):
    """(prefix, need) extended by digit P (D bits from the top; the last one what is left)."""
    SHIFT: tl.constexpr = 32 - (P + 1) * D if 32 - (P + 1) * D > 0 else 0
    NBITS: tl.constexpr = 32 - P * D - SHIFT
    bins = tl.arange(0, 1 << NBITS)
    if P == 0:
        match = in_row
    else:
        match = in_row & ((key >> (SHIFT + NBITS)) == prefix)
    dig = ((key >> SHIFT) & ((1 << NBITS) - 1)).to(tl.int32)
    hist = tl.histogram(tl.where(match, dig, 0), 1 << NBITS)
    hist -= tl.where(bins == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    digit = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
    need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    return (prefix << NBITS) | digit.to(tl.uint32), need


@triton.jit
def _once_kernel(scores_ptr, stride_s, pos_ptr, out_ptr, K: tl.constexpr, BLOCK: tl.constexpr,
                 OUT_BLOCK: tl.constexpr, D: tl.constexpr):
    """Row m's top-K from its keys loaded once (BLOCK >= its context): radix digits of D bits
    over the register tensor, each a histogram of the keys sharing the digits found so far,
    then the write (keys above the k-th, its lowest-positioned ties; ascending positions)."""
    m = tl.program_id(0)
    seq = tl.load(pos_ptr + m) + 1
    if seq <= K:
        _take_whole_context(out_ptr + m * K, seq, K, OUT_BLOCK)
    else:
        offs = tl.arange(0, BLOCK)
        in_row = offs < seq
        key = _keys(tl.load(scores_ptr + m * stride_s + offs, mask=in_row,
                            other=float("-inf")))
        prefix = tl.zeros((), tl.uint32)
        need = K
        for p in tl.static_range((32 + D - 1) // D):
            prefix, need = _once_digit(key, in_row, prefix, need, p, D)
        tie = in_row & (key == prefix)
        tie_rank = tl.cumsum(tie.to(tl.int32), axis=0) - 1
        take = in_row & ((key > prefix) | (tie & (tie_rank < need)))
        at = tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + m * K + at, offs.to(tl.int64), mask=take)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--widths", default="4096,8192,32768,65536,262144")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--forms", default="split,one_launch,cluster")
    p.add_argument("--table", type=int, default=0,
                   help="rows this wide, each row's context a --widths entry (default: the "
                        "width itself)")
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--out", default="")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    return p.parse_args()


def reference(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending positions of each row's k best scores, ties to the lowest positions."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    return torch.sort(order, dim=1).values.to(torch.int64)


def form_fn(name: str, scores, positions, k, out, dev):
    """A callable running form `name` into out, or None where it cannot run."""
    from sgl_kernel_ext.triton import arrival, overlap, topk

    m, width = scores.shape
    if name in ("split", "one_launch"):
        p = topk.split_chunks(width)
        hist = torch.zeros(2, m * p * 256, dtype=torch.int32, device=dev)
        state = torch.zeros(2, m * 2, dtype=torch.int32, device=dev)
        counts = torch.zeros(m * p * 2, dtype=torch.int32, device=dev)
        barriers = arrival.counters(2 * m, dev)
        one = name == "one_launch"
        if one and not topk.one_launch_chunk(m, width, overlap.prefetch_programs(dev)):
            return None

        def run():
            was = topk.ONE_LAUNCH
            topk.ONE_LAUNCH = one
            try:
                topk.topk_positions_split(scores, positions, k, out, hist, state, counts,
                                          barriers)
            finally:
                topk.ONE_LAUNCH = was
        return run
    if name in CLUSTER_FORMS:
        from sgl_kernel_ext.nvidia.sm90 import cluster_topk

        if cluster_topk.refusal(scores, positions, k, out):
            return None
        knobs = CLUSTER_FORMS[name]

        def run():
            was = {knob: getattr(cluster_topk, knob) for knob in knobs}
            for knob, value in knobs.items():
                setattr(cluster_topk, knob, value)
            try:
                cluster_topk.topk_positions(scores, positions, k, out)
            finally:
                for knob, value in was.items():
                    setattr(cluster_topk, knob, value)
        return run
    if name.startswith("once_"):
        _, block, warps, digit = name.split("_")
        block, warps, digit = int(block), int(warps), int(digit)
        if block < width:
            return None

        def run():
            _once_kernel[(m,)](scores, scores.stride(0), positions, out, K=k, BLOCK=block,
                               OUT_BLOCK=min(1024, k), D=digit, num_warps=warps)
        return run
    _, block, warps = name.split("_")
    block, warps = int(block), int(warps)
    if block > width:
        return None

    def run():
        topk._topk_kernel[(m,)](scores, scores.stride(0), width, positions, out, K=k,
                                BLOCK=block, OUT_BLOCK=min(1024, k), PDL=False,
                                num_warps=warps)
    return run


def trace_row(scores, positions, k, out, dev) -> dict:
    """cluster_topk's phases, one traced launch after a warm one: each TRACE_POINTS mark's
    median over the CTAs, us after the earliest CTA's start (a context loaded again each pass:
    "loaded" is its first pass counted)."""
    from sgl_kernel_ext.nvidia.sm90 import cluster_topk as C

    m, table = scores.shape
    width = int(positions[0]) + 1
    row = {"form": "cluster_trace", "rows": m, "width": width, "table": table}
    cluster = C.cluster_size(m, table, scores.device.index)
    row["cluster"] = cluster
    row["reloaded"] = width > cluster * C.THREADS * C.MAX_KEYS_PER_THREAD
    trace = torch.zeros(m * cluster, len(C.TRACE_POINTS), dtype=torch.int64, device=dev)
    for _ in range(2):
        C.topk_positions(scores, positions, k, out, trace=trace)
    torch.cuda.synchronize()
    trace = trace[trace[:, -1] != 0]  # CTAs that took part (16 a row: some may leave at once)
    t = (trace - trace[:, 0].min()).double() / 1e3
    row["phases_us"] = {p: round(float(t[:, i].median()), 2)
                        for i, p in enumerate(C.TRACE_POINTS)}
    H.log(f"cluster_trace rows {m:2d} width {width:6d}: " +
          " ".join(f"{p} {v}" for p, v in row["phases_us"].items()))
    return row


def main():
    args = parse()
    dev = torch.device("cuda")
    meta = {"benchmark": "topk_probe", "k": args.k, "replays": args.replays,
            "args": H.portable_args(args)}
    meta.update(H.run_meta(dev))
    torch.zeros(1, device=dev)  # the context current for the driver query below
    try:  # clusters of 8 and 16 CTAs the GPU holds at once, one CTA an SM (CuTe DSL's query)
        from cutlass.utils import HardwareInfo

        info = HardwareInfo(dev.index or 0)
        meta["max_active_clusters"] = {n: info.get_max_active_clusters(n) for n in (8, 16)}
        H.log(f"max active clusters (one CTA an SM): {meta['max_active_clusters']}")
    except Exception as e:  # noqa: BLE001 - measurement only: say why it is missing
        meta["max_active_clusters"] = f"unavailable: {type(e).__name__}: {e}"
    results = []
    for width in [int(w) for w in args.widths.split(",")]:
        for m in [int(r) for r in args.rows.split(",")]:
            gen = torch.Generator(device=dev).manual_seed(width + m)
            scores = torch.randn(m, max(width, args.table), generator=gen, device=dev)
            positions = torch.full((m,), width - 1, dtype=torch.int32, device=dev)
            want = reference(scores[:, :width], args.k)
            out = torch.empty(m, args.k, dtype=torch.int64, device=dev)
            for name in args.forms.split(","):
                fn = form_fn(name, scores, positions, args.k, out, dev)
                row = {"form": name, "rows": m, "width": width, "table": scores.shape[1]}
                if fn is None:
                    row["note"] = "does not apply"
                else:
                    try:
                        out.fill_(-7)
                        fn()
                        torch.cuda.synchronize()
                        row["exact"] = bool(torch.equal(out, want))
                        row["us"], _ = H.time_graph(fn, args.replays)
                        out.fill_(-7)
                        fn()
                        torch.cuda.synchronize()
                        row["exact_after_replays"] = bool(torch.equal(out, want))
                    except Exception as e:  # a form that fails to compile or run: say so
                        row["note"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
                results.append(row)
                H.log(f"{name:>14} rows {m:2d} width {width:6d}: "
                      + (f"{row['us']:8.1f} us exact {row['exact']}/{row['exact_after_replays']}"
                         if "us" in row else row["note"]))
            if "cluster" in args.forms.split(","):
                results.append(trace_row(scores, positions, args.k, out, dev))
    paths = H.write_json("topk_probe", {"meta": meta, "results": results},
                         [args.results, args.out])
    for p in paths:
        H.log(f"wrote {H.portable(str(p))}")


if __name__ == "__main__":
    main()
