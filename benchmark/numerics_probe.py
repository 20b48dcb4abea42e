"""Largest errors of the fused layer against the reference under one kernel setting.

Runs test/srt/kernels/test_fused_layer.py's reference cases (every layer kind, 1-16 rows,
contexts on both sides of index_topk) with module attributes of sgl_kernel_ext.triton set
first, in a fresh process (some are read at compile time), and writes each case's errors and
their maxima, so a kernel change that moves the numerics can be weighed against NUMERICS.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.numerics_probe \
        --set fp8_linear.SWAP=False --name no_swap --out $OUT
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys

from . import harness as H

METRICS = ("y_rel", "residual_rel", "kv_written_rel", "routing_flips")


def apply(setting: str) -> None:
    """module.ATTR=python-literal, on sgl_kernel_ext.triton.module (constexpr kept as such)."""
    import triton.language as tl

    target, value = setting.split("=", 1)
    mod_name, attr = target.rsplit(".", 1)
    mod = importlib.import_module(f"sgl_kernel_ext.triton.{mod_name}")
    v = ast.literal_eval(value)
    setattr(mod, attr, tl.constexpr(v) if isinstance(getattr(mod, attr), tl.constexpr) else v)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", action="append", default=[], help="module.ATTR=value")
    p.add_argument("--name", default="default")
    p.add_argument("--out", default="")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    args = p.parse_args()
    for s in args.set:
        apply(s)
    sys.path.insert(0, str(H.REPO / "test" / "srt" / "kernels"))
    import test_fused_layer as T

    import torch

    rows = []
    for kind in sorted(T.KINDS):
        for context in T.CONTEXTS:
            for m in T.ROWS:
                r = T.check(kind, m, context)
                rows.append({"kind": kind, "rows": m, "context": context,
                             **{k: r[k] for k in METRICS}})
                H.log(f"{args.name} {kind} M={m} ctx={context}: "
                      + " ".join(f"{k}={r[k]:.4g}" for k in METRICS))
    worst = {k: max(r[k] for r in rows) for k in METRICS}
    H.log(f"{args.name} max: " + " ".join(f"{k}={v:.4g}" for k, v in worst.items()))
    meta = {"benchmark": "numerics_probe", "name": args.name, "set": args.set,
            **H.run_meta(torch.device("cuda"))}
    H.write_json(f"numerics_probe_{args.name}", {"meta": meta, "max": worst, "cases": rows},
                 [args.results, args.out], H.stamp_now())


if __name__ == "__main__":
    main()
