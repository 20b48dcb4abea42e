"""Benchmark one GLM-5.3 decode layer of each kind on one TP8 rank, against the HBM floor.

Kinds: dense with indexer (layers 0-2), MoE with indexer, MoE reusing the previous top-k.
For each kind a stack of `--copies` layers (distinct memory, together several times the L2) is
captured in one CUDA graph per arm and (M, L); time per layer = median replay / copies.
A replay's own start, shared by the stack, does not move a layer's share of its floor: on an
H100 the MoE layer at 1 row took 61.3-61.4 us with 4 copies and 61.0 with 16, at 16 rows 76%
of its floor with either (results/decode_layer_20261206T140058Z .. T140319Z; at 16 rows the
deeper stack's layers touched fewer experts, 74.75 against 79, its time and floor both 4% less).
Arms: stock (benchmark.stock), upstream (SGLang's own Triton kernels loaded from its wheel, see
benchmark.upstream), fused (sglang.srt.layers.fused_decode.layer.build_fused_layer: one launch
of the persistent layer kernel per layer), fused_stages (the same layer on its stage kernels,
one launch each), and the floor (benchmark.roofline at the bandwidth measured here,
with the routed experts the run really touched).

    PYTHONPATH=python:sgl-kernel-ext python3 -m benchmark.decode_layer --out $OUT

`--dry` runs the tiny config on the CPU (no timing; needs TRITON_INTERPRET=1) to check wiring.
`--variant NAME` times the fused arms under one of tiling_probe's VARIANTS (an opt-in form's
release table before it becomes the default; meta.variant says which).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

from . import harness as H
from . import roofline as RL
from .stock import STOCK_OPS, Rows, stock_forward

ARMS = ("stock", "upstream", "fused", "fused_stages")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="dense,moe_idx,moe")
    p.add_argument("--ms", default="1,2,4,8,16")
    p.add_argument("--ls", default="2048,8192,32768")
    p.add_argument("--copies", type=int, default=4, help="layers per kind in the stack (dense: <= 3)")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--upstream-dir", default=".cache/upstream")
    p.add_argument("--check", action="store_true", help="compare arms with the reference once per kind")
    p.add_argument("--out", default="", help="extra folder for JSON/log (e.g. $OUT)")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    p.add_argument("--dry", action="store_true", help="tiny config on the CPU, no timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="baseline",
                   help="the fused arms under one of tiling_probe's VARIANTS' knob settings "
                        "(the stock and upstream arms use none of those knobs)")
    return p.parse_args(argv)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main(argv=None):
    args = parse(argv)
    from . import tiling_probe

    modules = tiling_probe.knob_modules()
    with tiling_probe.applied(args.variant, modules, tiling_probe.derived_values(modules)):
        run(args)


def run(args):
    """The table of parse()'s arguments, written as decode_layer_<stamp>.json."""
    from sglang.srt.layers.fused_decode.reference.config import glm53_config, tiny_config
    from sglang.srt.layers.fused_decode.reference.model import layer_forward

    dev = torch.device("cpu" if args.dry else "cuda")
    cfg = tiny_config() if args.dry else glm53_config()
    tp = 1 if args.dry else 8
    geom = RL.Geometry.from_config(cfg)
    kinds = args.kinds.split(",")
    ms = [int(v) for v in args.ms.split(",")]
    ls = [int(v) for v in args.ls.split(",")] if not args.dry else [40]
    arms = [a for a in args.arms.split(",") if a]
    meta = {"benchmark": "decode_layer", "tp": tp, "kv_dtype": "bf16", "copies": args.copies,
            "replays": args.replays, "variant": args.variant, "args": H.portable_args(args)}
    if not args.dry:
        meta.update(H.run_meta(dev))
        bw = H.measure_bandwidth(dev)
    else:
        bw = 4.3e12
    meta["bandwidth_Bps"] = bw
    H.log(f"bandwidth (device copy) {bw / 1e12:.3f} TB/s; {meta.get('gpu', 'cpu dry run')}")

    ops = {"stock": STOCK_OPS}
    if "upstream" in arms:
        from . import upstream

        up_ops, report = upstream.load_ops(args.upstream_dir)
        meta["upstream"] = report
        H.log(f"upstream: {json.dumps(report)[:600]}")
        if up_ops is not None:
            ops["upstream"] = up_ops
    build_fused, fused_state = H.fused_builder() if {"fused", "fused_stages"} & set(arms) else (None, "not requested")
    meta["fused"] = fused_state
    H.log(f"fused arm: {fused_state}")

    rows_out, checks = [], []
    stamp = H.stamp_now()

    def save(final=False):
        present = [a for a in arms if any(r["arm"] == a and r.get("us") for r in rows_out)]
        table = H.markdown_table(rows_out, present)
        payload = {"meta": meta, "complete": final, "checks": checks, "results": rows_out,
                   "by_key": {r["key"]: r for r in rows_out}, "table_md": table}
        paths = [] if args.dry else H.write_json("decode_layer", payload, [args.results, args.out], stamp)
        return table, paths

    for kind in kinds:
        n = min(args.copies, 3) if kind == "dense" else args.copies
        ids = H.layer_ids_of_kind(cfg, kind, n)
        t0 = time.time()
        base = H.gen_base(cfg, ids[0], args.seed, tp, dev)
        layers = [H.assemble(cfg, ids[0], base)]
        for lid in ids[1:]:
            layers.append(H.assemble(cfg, lid, H.clone_base(base)))
        del base
        if dev.type == "cuda":
            torch.cuda.synchronize()
        H.log(f"{kind}: layers {ids} built in {time.time() - t0:.1f}s")
        max_slots = max(ms) * max(ls)
        caches = H.make_caches(cfg, ids, -(-max_slots // 64) * 64, dev)
        fused, fused_stages = {}, {}
        if build_fused is not None:
            try:
                fused = {lw.layer_id: build_fused(cfg, lw, caches, max(ms)) for lw, _ in layers}
                if "fused_stages" in arms:  # the same layer on one launch per stage kernel
                    fused_stages = {lw.layer_id: build_fused(cfg, lw, caches, max(ms),
                                                             persistent_launch=False)
                                    for lw, _ in layers}
            except Exception as e:  # a half-built fused module must not stop the run
                meta["fused"] = f"build failed: {type(e).__name__}: {e}"
                H.log(meta["fused"])
        for ctx in ls:
            for m in ms:
                batch = H.make_batch(m, ctx, dev)
                rows = Rows.from_batch(batch)
                hid, res, tprev = H.layer_inputs(cfg, m, ctx, dev)
                record = {}

                def run_stock(op=ops["stock"], rec=None):
                    h, r, t = hid, res, tprev
                    for lw, sl in layers:
                        h, r, t = stock_forward(cfg, sl, h, r, rows, caches, t, op, rec)
                    return h

                def run_fused(built=fused):
                    h, r, t = hid, res, tprev
                    for lw, _ in layers:
                        h, r, t = built[lw.layer_id](h, r, batch, t)
                    return h

                run_stock(rec=record)  # eager: compiles, and records the experts chosen
                experts = None
                if kind != "dense":
                    experts = sum(int(torch.unique(v).numel()) for v in record.values()) / len(record)
                fb = RL.layer_bytes(kind, tp, m, ctx, "bf16", geom, experts)
                extra_idx = (m * ctx * 4 * 2) if kind != "moe" else 0  # indexer logits out + in
                base_info = {"floor_bytes_expected_experts": RL.layer_bytes(kind, tp, m, ctx, "bf16", geom),
                             "experts_touched": experts}
                if args.check and m == min(ms, key=lambda v: abs(v - 4)) and ctx == ls[0]:
                    checks.append(check(cfg, layers[0], hid, res, batch, rows, caches, tprev, ops,
                                        fused, layer_forward, kind, m, ctx))
                    H.log(f"check {checks[-1]}")
                stock_us = None
                for arm in arms:
                    us, note, extra = None, None, dict(base_info)
                    try:
                        if arm in ops:
                            fn = (lambda op=ops[arm]: run_stock(op))
                        elif arm == "fused" and fused:
                            fn = run_fused
                            fn()
                        elif arm == "fused_stages" and fused_stages:
                            fn = (lambda: run_fused(fused_stages))
                            fn()
                        else:
                            note = meta["fused"] if arm.startswith("fused") else f"{arm} unavailable"
                            fn = None
                        if fn is not None:
                            if args.dry:
                                t1 = time.perf_counter()
                                fn()
                                us = (time.perf_counter() - t1) * 1e6 / len(layers)
                            else:
                                med, _ = H.time_graph(fn, args.replays)
                                us = med / len(layers)
                    except Exception as e:
                        note = f"failed: {type(e).__name__}: {e}"
                        traceback.print_exc()
                    if arm in ("stock", "upstream"):
                        extra["bytes_moved_est"] = fb + extra_idx
                    if arm == "stock":
                        stock_us = us
                    row = H.result_row(arm, kind, m, ctx, us, fb, bw, stock_us, note=note, **extra)
                    rows_out.append(row)
                    H.log(f"{row['key']}: " + (f"{us:.1f} us, floor {row['floor_us']:.1f} us, "
                                               f"frac {row['fraction_of_floor']:.3f}" if us else str(note)))
                del batch, rows, record
        del layers, caches, fused, fused_stages
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        save()

    table, paths = save(final=True)
    for p in paths:
        H.log(f"wrote {H.portable(str(p))}")
    print()
    print(f"decode_layer, GLM-5.3 TP8 rank, KV bf16, bandwidth {bw / 1e12:.2f} TB/s, "
          f"fused: {meta['fused']}")
    print(table)


def check(cfg, layer, hid, res, batch, rows, caches, tprev, ops, fused, layer_forward, kind, m, ctx):
    """Each arm's layer output against the reference on the same inputs (cache rows of this
    step are rewritten with the same values by each arm)."""
    lw, sl = layer
    out = {"kind": kind, "M": m, "L": ctx}
    y_r, r_r, t_r = layer_forward(cfg, [lw], hid, res, batch, caches, tprev)
    for name, op in ops.items():
        try:
            y, r, t = stock_forward(cfg, sl, hid, res, rows, caches, tprev, op)
            same = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(t, t_r))
            out[name] = {"rel_err_y": rel_err(y, y_r), "rel_err_residual": rel_err(r, r_r),
                         "topk_overlap": same / t_r.numel()}
        except Exception as e:
            out[name] = f"failed: {type(e).__name__}: {e}"
    if fused:
        try:
            y, r, t = fused[lw.layer_id](hid, res, batch, tprev)
            out["fused"] = {"rel_err_y": rel_err(y, y_r), "rel_err_residual": rel_err(r, r_r),
                            "topk_equal": bool(torch.equal(t, t_r))}
        except Exception as e:
            out["fused"] = f"failed: {type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    main()
