"""Probe: what building a step's rows (``runtime.step_rows``) costs per decode step.

A server's ``req_to_token`` spans its longest context (1M positions for GLM-5.3's config), and
the fused layers address their cache slots through the rows ``step_rows`` hands them. Times,
in a CUDA graph on a pool of `--requests` request rows, ``step_rows`` for each table width
and row count (decode: a request a row; verify: ``--verify-rows`` rows a request), so the
per-step cost of that addressing can be set beside the step's own time.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.step_rows_probe --out $OUT
"""

from __future__ import annotations

import argparse

import torch

from sglang.srt.layers.fused_decode import runtime

from . import harness as H


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="8192,131072,1048576")
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--verify-rows", type=int, default=4)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--out", default="", help="extra folder for the JSON (e.g. $OUT)")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    return p.parse_args()


def main():
    args = parse()
    dev = torch.device("cuda")
    widths = [int(w) for w in args.widths.split(",")]
    table = torch.randint(0, 1 << 24, (args.requests, max(widths)), dtype=torch.int32, device=dev)
    results = []
    for width in widths:
        for rows in (int(r) for r in args.rows.split(",")):
            for per_req in sorted({1, args.verify_rows}):
                if rows % per_req:
                    continue
                reqs = torch.randperm(args.requests, device=dev)[: rows // per_req]
                pos = torch.randint(0, width, (rows,), dtype=torch.int64, device=dev)
                real = torch.tensor(rows, device=dev)
                us, _ = H.time_graph(lambda: runtime.step_rows(pos, table, reqs, per_req, width,
                                                               real), args.replays)
                results.append({"width": width, "rows": rows, "rows_per_req": per_req, "us": us})
                H.log(f"width {width} rows {rows} per request {per_req}: {us:.1f} us")
    meta = {"benchmark": "step_rows_probe", **H.run_meta(dev), "args": H.portable_args(args)}
    for p in H.write_json("step_rows_probe", {"meta": meta, "results": results},
                          [args.out, args.results]):
        H.log(f"wrote {H.portable(str(p))}")


if __name__ == "__main__":
    main()
