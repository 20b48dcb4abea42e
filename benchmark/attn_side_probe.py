"""Probe: the attention side's one launch so far (``nvidia.sm90.attn_side``: q_a|kv_a, then q_b
on c_q normed and quantized inside q_b's units) against the Triton stage kernels that do the
same work in the fused layer, at 1-16 rows, in the same run.

Arms (one GLM-5.3 TP8 rank: q_a|kv_a 2624 x 6144, q_b 2048 x 2048, FP8 block-128):
- ``attn_side``: one launch (programmatically dependent on the one before); ``_nopdl``
  launched plainly; ``_early_q_b`` with q_b's weights asked for beside q_a|kv_a's (not after
  them); ``q_a|kv_a_only`` its first stage alone (measurement form); ``_hot`` on
  one weight copy (in L2: the launch's latency without HBM); ``_fixed`` (1-2 rows) with
  q_a|kv_a's chunks added as integers, no tails, and the KV-cache row written as stages3 does
  (``AttnSide.fixed``).
- ``stages3``: fp8_linear (q_a|kv_a's K chunks), latent (c_q normed and quantized; the
  KV-cache row), fp8_linear (q_b): the layer's form from 3 rows.
- ``stages2``: fp8_linear with row tails (bf16 rows and sums of squares), q_b_normed (c_q
  normed inside q_b's programs; the KV-cache row): the layer's form at 1-2 rows.
Both Triton arms run under the layer's overlap (programmatic dependent launches) and also
write the KV-cache row (c_kv's norm, rope), which attn_side leaves to a later stage. Each arm
is timed in a CUDA graph cycling through enough weight copies that none stays in L2
(``gemv_probe.graph_time``); the floor is the weights' bytes over the copy bandwidth that
decode_layer's floors use (``harness.measure_bandwidth``). ``--trace`` adds one cold launch
a row count with each worker's phases timed (``attn_side.TRACE_POINTS``).

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.attn_side_probe --out $OUT

On an H200 (results/attn_side_probe_20261204T145411Z, acd07c0; floor 4.83 us):

    rows          1      2      4      8     12     16
    attn_side  11.52  11.75  11.74  11.99  12.75  13.62
    _nopdl     13.17  12.71  12.95  13.11  14.02  14.41
    _early_q_b 12.83  12.34  12.60  12.80  13.38  14.21
    q_a|kv_a    8.64   8.88   9.19   9.17   8.77   9.04   (its first stage alone)
    _hot        9.89  10.08  10.20  10.62  11.16  11.86   (weights in L2)
    stages3    11.14  11.14  11.44  11.70  11.80  12.33
    stages2    13.20  13.22  13.35  13.52  13.83  14.48

At 6eeb3fa (results/attn_side_probe_20261204T182239Z, two passes of 1-2 rows): attn_side_fixed
10.34 / 10.35 us against stages3's 11.09 / 11.16 at one row, 11.48 / 11.11 against 11.51 /
11.21 at two.

attn_side's module docstring has its trace and what each change bought. Alone like this,
stages2 (the layer's form at 1-2 rows, mla.LATENT_IN_Q_B_MAX_ROWS) is ~2 us slower than
stages3; the layer chose it from a layer-level A/B, which this probe does not repeat.
"""

from __future__ import annotations

import argparse

import torch

from benchmark.gemv_probe import graph_time
from benchmark.harness import measure_bandwidth, run_meta, write_json
from sgl_kernel_ext.nvidia.sm90 import attn_side as A
from sgl_kernel_ext.nvidia.sm90.fp8_mma import x_rows
from sgl_kernel_ext.triton import fp8_linear, mla, overlap

EPS = 1e-5
SLOTS = 16 * 512  # a row of slots a step row


def weights(shape: A.Shape, dev, copies: int) -> list:
    nq, nkv, k1, nb = shape

    def one(n, k):
        return (torch.randn(n, k, device=dev).to(torch.float8_e4m3fn),
                torch.rand(-(-n // 128), k // 128, device=dev) * 0.02 + 1e-3)

    return [dict(zip(("wq", "wsq", "wkv", "wskv", "wb", "wsb"),
                     (*one(nq, k1), *one(nkv, k1), *one(nb, nq)))) for _ in range(copies)]


def timeline(marks) -> dict:
    """{point: (min, median, max) us after the first worker's start} over the workers that
    reached it."""
    marks = marks.cpu().double()
    t0 = marks[:, 0][marks[:, 0] > 0].min()
    out = {}
    for i, name in enumerate(A.TRACE_POINTS):
        col = marks[:, i][marks[:, i] > 0]
        if col.numel():
            us = (col - t0) / 1e3
            out[name] = (float(us.min()), float(us.median()), float(us.max()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,2,4,8,12,16")
    ap.add_argument("--trace", action="store_true",
                    help="also one traced launch a row count: where each worker's time goes")
    args = ap.parse_args()
    dev = torch.device("cuda")
    shape = A.Shape()
    nq, nkv, k1, nb = shape
    kv_lora, rope = 512, nkv - 512
    nbytes = (nq + nkv) * k1 + nb * nq
    copies = max(8, -(-240 * 2**20 // nbytes))
    bw = measure_bandwidth(dev)  # as decode_layer's floors
    floor = nbytes / bw * 1e6
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {nbytes / 1e6:.1f} MB a launch, floor "
          f"{floor:.2f} us; {copies} weight copies", flush=True)
    ws = weights(shape, dev, copies)
    gamma = (1 + 0.3 * torch.randn(nq, device=dev)).to(torch.bfloat16)
    kv_norm = (1 + 0.3 * torch.randn(kv_lora, device=dev)).to(torch.bfloat16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rope, 2, device=dev).float() / rope))
    kv_cache = torch.zeros(SLOTS, nkv, dtype=torch.bfloat16, device=dev)
    rows = []
    for m in map(int, args.ms.split(",")):
        xq = torch.randn(x_rows(m), k1, device=dev).to(torch.float8_e4m3fn)
        sx = torch.rand(m, k1 // 128, device=dev) * 0.02 + 1e-3
        positions = torch.arange(100, 100 + m, device=dev)
        slots = (torch.arange(m, device=dev)[:, None] * 512
                 + torch.arange(512, device=dev)[None, :]).to(torch.int32)
        side, _ = A.compiled(m, shape, eps=EPS)
        kv_parts = torch.empty(side.split1, m, nkv, device=dev)
        q_rows = torch.empty(m, nq, dtype=torch.bfloat16, device=dev)
        qb_parts = torch.empty(side.split2, m, nb, device=dev)
        work = A.workspace(side, dev)
        fixed = m <= A.FIXED_MAX_ROWS
        work_fixed = A.workspace(A.compiled(m, shape, eps=EPS, fixed=True)[0], dev) \
            if fixed else None

        kv_args = dict(kv_norm=kv_norm, positions=positions, token_slots=slots,
                       inv_freq=inv_freq, kv_cache=kv_cache)

        def one_launch(i, pdl=True, first_only=False, late_q_b=True, fixed=False, trace=None):
            w = ws[i]
            A.attn_side(xq, sx, w["wq"], w["wsq"], w["wkv"], w["wskv"], gamma, w["wb"],
                        w["wsb"], kv_parts, q_rows, qb_parts, work_fixed if fixed else work,
                        eps=EPS, pdl=pdl, first_only=first_only, late_q_b=late_q_b, fixed=fixed,
                        trace=trace, **(kv_args if fixed else {}))

        bn1, g1, s1 = fp8_linear.tiling(nq + nkv, k1)
        bn2, g2, s2 = fp8_linear.tiling(nb, nq)
        qa = torch.empty(s1, m, nq, device=dev)
        kva = torch.empty(s1, m, nkv, device=dev)
        cq_q = torch.empty(m, nq, dtype=torch.float8_e4m3fn, device=dev)
        cq_s = torch.empty(m, nq // 128, device=dev)
        qb = torch.empty(s2, m, nb, device=dev)
        arrivals = torch.zeros(64, dtype=torch.int32, device=dev)
        rows_q = torch.empty(m, nq, dtype=torch.bfloat16, device=dev)
        ss_q = torch.empty(m, nq // bn1, device=dev)
        rows_kv = torch.empty(m, nkv, dtype=torch.bfloat16, device=dev)
        ss_kv = torch.empty(m, nkv // bn1, device=dev)

        def stages3(i):
            w = ws[i]
            fp8_linear.fp8_linear(xq[:m], sx, w["wq"], w["wsq"], qa, w["wkv"], w["wskv"], kva,
                                  bn1, g1)
            mla.latent(qa, kva, gamma, kv_norm, EPS, positions, slots, inv_freq, cq_q, cq_s,
                       kv_cache, kv_lora, rope)
            fp8_linear.fp8_linear(cq_q, cq_s, w["wb"], w["wsb"], qb, block_n=bn2, groups=g2)

        def stages2(i):
            w = ws[i]
            fp8_linear.fp8_linear(xq[:m], sx, w["wq"], w["wsq"], qa, w["wkv"], w["wskv"], kva,
                                  bn1, g1, tails=(arrivals, rows_q, ss_q, rows_kv, ss_kv))
            mla.q_b_normed(rows_q, ss_q, gamma, rows_kv, ss_kv, kv_norm, EPS, positions, slots,
                           inv_freq, kv_cache, kv_lora, rope, w["wb"], w["wsb"], qb,
                           block_n=bn2, groups=g2)

        arms = {"attn_side": graph_time(one_launch, copies),
                "attn_side_nopdl": graph_time(lambda i: one_launch(i, pdl=False), copies),
                "attn_side_early_q_b": graph_time(lambda i: one_launch(i, late_q_b=False),
                                                  copies),
                "q_a|kv_a_only": graph_time(lambda i: one_launch(i, first_only=True), copies),
                "attn_side_hot": graph_time(lambda i: one_launch(0), copies)}
        if fixed:
            arms["attn_side_fixed"] = graph_time(lambda i: one_launch(i, fixed=True), copies)
            arms["attn_side_fixed_hot"] = graph_time(lambda i: one_launch(0, fixed=True), copies)
            A.check_sync(work_fixed)
        A.check_sync(work)
        traces = {}
        for form in ("attn_side", "attn_side_fixed") if args.trace else ():
            if form == "attn_side_fixed" and not fixed:
                continue
            # one launch, cold weights, each worker's points
            marks = torch.zeros(A.TRACE_WORKERS, len(A.TRACE_POINTS), dtype=torch.int64,
                                device=dev)
            # each form on weight copies of its own, cold (the one before it left its in L2)
            first = 1 if form == "attn_side" else 3
            for i in (first, first + 1):
                one_launch(i, fixed=form == "attn_side_fixed",
                           trace=marks if i == first + 1 else None)
            torch.cuda.synchronize()
            traces[form] = timeline(marks)
            print(f"m={m:2d} {form} trace (us from the first worker's start: min / median / "
                  "max over workers): " + "; ".join(f"{k} {v[0]:.2f} / {v[1]:.2f} / {v[2]:.2f}"
                                                    for k, v in traces[form].items()), flush=True)
        with overlap.step_rows(m):
            arms["stages3"] = graph_time(stages3, copies)
            arms["stages2"] = graph_time(stages2, copies)
        for form, trace in traces.items():
            rows.append({"m": m, "arm": f"{form} trace", "points_us": trace})
        for arm, us in arms.items():
            rows.append({"m": m, "arm": arm, "us": us, "floor_us": floor,
                         "frac_floor": floor / us, "bytes": nbytes,
                         "splits": [side.split1, side.split2] if arm == "attn_side" else
                         [s1, s2]})
        best = min(arms["stages3"], arms["stages2"])
        print(f"m={m:2d} floor {floor:5.2f}  " + "  ".join(
            f"{a} {t:6.2f} ({floor / t:4.0%})" for a, t in arms.items())
            + f"  stages/attn_side {best / arms['attn_side']:.2f}x", flush=True)
    meta = run_meta(dev)
    meta.update(benchmark="attn_side_probe", copy_bandwidth_bytes_per_s=bw, shape=list(shape))
    write_json("attn_side_probe", {"meta": meta, "results": rows}, [args.out])


if __name__ == "__main__":
    main()
