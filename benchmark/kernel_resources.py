"""Registers, spills and shared memory of every compiled stage kernel, as the GPU loaded them.

Runs one real-shape layer of each kind (one TP8 rank, L = 2048) for each row count on the
stage kernels (and the persistent kernel with --persistent), then lists each Triton kernel
variant the run compiled: its name, warps, registers, spilled bytes and shared memory, and
the compile-time constants that tell the variants apart. A spill in a hot kernel is worth
a tiling probe (benchmark/tiling_probe.py).

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.kernel_resources --out $OUT
"""

from __future__ import annotations

import argparse
import importlib
import json

import torch

from . import harness as H

MODULES = ("bf16_linear", "fp8_linear", "indexer", "mla", "moe", "norm", "topk", "persistent")


def compiled_variants():
    """(kernel name, CompiledKernel) for every kernel of sgl_kernel_ext.triton compiled so far."""
    from triton.runtime.jit import JITFunction

    for mod_name in MODULES:
        mod = importlib.import_module(f"sgl_kernel_ext.triton.{mod_name}")
        for name, fn in vars(mod).items():
            if not isinstance(fn, JITFunction) or not name.endswith("_kernel"):
                continue
            for cache in getattr(fn, "device_caches", {}).values():
                kernels = cache[0] if isinstance(cache, tuple) else cache
                for kernel in kernels.values():
                    yield name, kernel


def describe(name, kernel) -> dict:
    md = kernel.metadata
    consts = getattr(getattr(kernel, "src", None), "constants", None) or {}
    return {"kernel": name, "num_warps": md.num_warps, "num_stages": getattr(md, "num_stages", None),
            "registers": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None),
            "shared_bytes": md.shared,
            "constants": {str(k): v for k, v in consts.items() if isinstance(v, (int, bool, float))}}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="dense,moe_idx,moe")
    p.add_argument("--ms", default="1,2,4,16")
    p.add_argument("--persistent", action="store_true", help="also run the persistent kernel")
    p.add_argument("--out", default="")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    args = p.parse_args()

    from sglang.srt.layers.fused_decode.layer import FusedLayer
    from sglang.srt.layers.fused_decode.reference.config import glm53_config

    dev = torch.device("cuda")
    cfg = glm53_config()
    ms = [int(v) for v in args.ms.split(",")]
    for kind in args.kinds.split(","):
        lid = H.layer_ids_of_kind(cfg, kind, 1)[0]
        lw, _ = H.assemble(cfg, lid, H.gen_base(cfg, lid, 0, 8, dev))
        caches = H.make_caches(cfg, [lid], -(-(max(ms) * 2048) // 64) * 64, dev)
        for persistent in (False, True) if args.persistent else (False,):
            layer = FusedLayer(cfg, lw, caches, max(ms), 2048, persistent_launch=persistent)
            for m in ms:
                batch = H.make_batch(m, 2048, dev)
                hid = torch.randn(m, cfg.hidden_size, device=dev).to(torch.bfloat16)
                layer(hid, hid.clone(), batch, H.random_topk(cfg, m, 2048, dev))
        torch.cuda.synchronize()
        H.log(f"{kind}: ran rows {ms}")
        del lw, caches
    rows = [describe(n, k) for n, k in compiled_variants()]
    rows.sort(key=lambda r: (-(r["spills"] or 0), r["kernel"]))
    for r in rows:
        print(json.dumps(r), flush=True)
    H.write_json("kernel_resources", {"meta": H.run_meta(dev), "results": rows},
                 [args.results, args.out], H.stamp_now())


if __name__ == "__main__":
    main()
