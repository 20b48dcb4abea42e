"""Run the torch reference at real GLM-5.3 shapes on one GPU: one TP8 rank's MoE layers.

Phase 1: layer 6 (MoE + own indexer) and layer 7 (MoE reusing layer 6's top-k) of TP8 rank 0,
weights generated on the GPU from a seed, caches filled with random rows, decode steps of
M = 1..16 rows, each row a request with a context of --ctx tokens (> index_topk, so the top-k is
exercised). Reports weight bytes, generation time, median step time and peak memory per M.
Phase 2 (--full-rank, time permitting): all 78 layers + embedding + LM head of one TP8 rank
built in GPU memory, bytes and peak memory, and whole decode steps at M=1 and M=16.

Phase 0 (--device-check): the tiny config's weights built on the GPU equal those built on the
CPU bitwise, and a tiny decode on the GPU matches the CPU (KL of the logits).

Writes $OUT/reference_real_shapes.json (updated after every measurement) and prints a summary.
Usage: PYTHONPATH=python:sgl-kernel-ext python benchmark/reference_real_shapes.py --out $OUT
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

from sglang.srt.layers.fused_decode.reference import batch as B, cache as K, config as C
from sglang.srt.layers.fused_decode.reference import model, weights as W


CUDA = torch.cuda.is_available()


def sync():
    if CUDA:
        torch.cuda.synchronize()


def peak_gb():
    return torch.cuda.max_memory_allocated() / 1e9 if CUDA else 0.0


def reset_peak():
    if CUDA:
        torch.cuda.reset_peak_memory_stats()


def make_batch(m, ctx, num_slots, seed, device):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_slots, generator=g)
    tables = [perm[i * ctx:(i + 1) * ctx] for i in range(m)]
    return B.decode_batch([ctx - 1] * m, tables, device)


def time_fn(fn, reps):
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts), ts


def _tensors(obj, prefix=""):
    from sglang.srt.layers.fused_decode.reference.quant import Fp8Weight

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Fp8Weight):
        yield prefix + ".q", obj.q
        yield prefix + ".s", obj.s
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}")
    elif hasattr(obj, "__dataclass_fields__"):
        for f in obj.__dataclass_fields__:
            if f != "cfg":
                yield from _tensors(getattr(obj, f), f"{prefix}.{f}")


def device_check():
    from sglang.srt.layers.fused_decode.reference import rng
    from sglang.srt.layers.fused_decode.reference.engine import ReferenceEngine
    from sglang.srt.layers.fused_decode.reference.kl import kl_div
    from sglang.srt.layers.fused_decode.reference.quant import FP32, SGLANG

    cfg = C.tiny_config()
    wc = W.generate_weights(cfg, 0, mtp=True)
    wg = W.generate_weights(cfg, 0, device="cuda", mtp=True)
    gpu = dict(_tensors(wg))
    n, bad = 0, []
    for name, t in _tensors(wc):
        g = gpu[name].cpu()
        same = torch.equal(t.view(torch.uint8), g.view(torch.uint8)) if t.dtype == torch.float8_e4m3fn \
            else torch.equal(t, g)
        n += 1
        if not same:
            bad.append(name)
    pin = rng.uniform(0, "pin", [4, 5], device="cuda").flatten()[:6].cpu().tolist()
    out = {"tensors": n, "mismatched": bad[:20], "pin": pin}
    g = torch.Generator().manual_seed(100)
    prompts = [torch.randint(2, cfg.vocab_size, (k,), generator=g).tolist() for k in (20, 33, 9, 3)]
    for name, num in (("fp32", FP32), ("sglang", SGLANG)):
        logits = []
        for w, dev in ((wc, "cpu"), (wg, "cuda")):
            eng = ReferenceEngine(cfg, w, 512, dev, num)
            rids = [eng.add_request(p, len(p) + 1) for p in prompts]
            eng.prefill(rids)
            logits.append(eng.decode(rids, [5, 6, 7, 8]).cpu())
        k = kl_div(logits[0], logits[1])
        out[f"decode_kl_cpu_vs_cuda_{name}"] = {"mean": float(k.mean()), "max": float(k.max())}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--full-rank", action="store_true")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test at the tiny config, TP2")
    ap.add_argument("--device-check", action="store_true")
    ap.add_argument("--skip-phase1", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    dev = torch.device("cuda" if CUDA else "cpu")
    cfg = C.tiny_config() if args.tiny else C.glm53_config()
    tp = 2 if args.tiny else 8
    # the first MoE layer with its own indexer whose next layer reuses its top-k (6 and 7 at real shapes)
    lf = next(i for i in range(cfg.num_hidden_layers - 1)
              if cfg.is_moe(i) and cfg.runs_indexer(i) and not cfg.runs_indexer(i + 1))
    ls = lf + 1
    ms = [int(x) for x in args.ms.split(",")]
    res = {"commit": args.commit, "device": torch.cuda.get_device_name() if CUDA else "cpu",
           "torch": torch.__version__,
           "tp_size": tp, "tp_rank": 0, "layers": [lf, ls],
           "config": "tiny" if args.tiny else "glm53", "ctx": args.ctx, "index_topk": cfg.index_topk,
           "numerics": "sglang (bf16 activations, FP8 per-128 activation quant)", "phase1": {}}
    out_json = os.path.join(args.out, "reference_real_shapes.json")

    def save():
        with open(out_json, "w") as f:
            json.dump(res, f, indent=1)

    if args.device_check and CUDA:
        res["device_check"] = device_check()
        save()
        print("device check:", res["device_check"], flush=True)
    if args.skip_phase1:
        ms = []
    reset_peak()
    t = time.perf_counter()
    w = W.generate_weights(cfg, args.seed, tp_size=tp, tp_rank=0, device=dev, layers=[lf, ls],
                           embed_and_head=False)
    sync()
    res["phase1"]["gen_s"] = time.perf_counter() - t
    res["phase1"]["layer_bytes"] = {i: W.tensor_bytes(w.layers[i]) for i in (lf, ls)}
    num_slots = -(-max(ms) * args.ctx // 64) * 64
    caches = K.alloc_caches(cfg, num_slots, dev, layers=[lf, ls])
    K.fill_random(caches, args.seed)
    sync()
    res["phase1"]["cache_bytes"] = sum(t.numel() * t.element_size() for t in
                                       list(caches.kv.values()) + list(caches.index.values()))
    res["phase1"]["mem_after_setup_gb"] = torch.cuda.memory_allocated() / 1e9 if CUDA else 0.0
    rows = []
    for m in ms:
        bt = make_batch(m, args.ctx, num_slots, m, dev)
        g = torch.Generator(device=dev).manual_seed(m)  # fresh random activations per M
        h = torch.randn(m, cfg.hidden_size, device=dev, generator=g).bfloat16()
        r = torch.randn(m, cfg.hidden_size, device=dev, generator=g).bfloat16()
        state = {}

        def full():
            state["a"] = model.layer_forward(cfg, [w.layers[lf]], h, r, bt, caches)

        def shared():
            state["b"] = model.layer_forward(cfg, [w.layers[ls]], h, r, bt, caches, state["a"][2])

        reset_peak()
        t6, ts6 = time_fn(full, args.reps)
        t7, ts7 = time_fn(shared, args.reps)
        peak = peak_gb()
        y6, y7 = state["a"][0], state["b"][0]
        again = model.layer_forward(cfg, [w.layers[lf]], h, r, bt, caches)[0]
        row = {"M": m, "full_layer_ms": t6, "shared_layer_ms": t7, "peak_gb": peak,
               "finite": bool(torch.isfinite(y6).all() and torch.isfinite(y7).all()),
               "deterministic": bool(torch.equal(again, y6)),
               "topk_valid": int((state["a"][2] >= 0).sum(1).min()),
               "full_layer_times_ms": ts6, "shared_layer_times_ms": ts7}
        rows.append(row)
        res["phase1"]["rows"] = rows
        save()
        print(f"M={m:2d} layer{lf} {t6:8.1f} ms  layer{ls} {t7:8.1f} ms  peak {peak:6.2f} GB  "
              f"finite={row['finite']} det={row['deterministic']} topk={row['topk_valid']}", flush=True)
    del w, caches, state
    if CUDA:
        torch.cuda.empty_cache()

    if args.full_rank and not args.tiny and time.time() - t_start < args.budget_s * 0.3:
        ph = res["phase2"] = {}
        reset_peak()
        t = time.perf_counter()
        wf = W.ModelWeights(cfg, 8, 0)
        for i in range(cfg.num_hidden_layers):
            wf.layers[i] = W.gen_layer(cfg, args.seed, i, 8, 0, dev)
            if time.time() - t_start > args.budget_s * 0.75:
                ph["stopped_at_layer"] = i
                break
        head = W.generate_weights(cfg, args.seed, 8, 0, dev, layers=[])
        wf.embed, wf.final_norm, wf.lm_head = head.embed, head.final_norm, head.lm_head
        sync()
        ph["gen_s"] = time.perf_counter() - t
        ph["layers"] = len(wf.layers)
        ph["weight_bytes"] = W.tensor_bytes(wf)
        ph["peak_after_gen_gb"] = peak_gb()
        save()
        print(f"full rank: {len(wf.layers)} layers, {ph['weight_bytes'] / 1e9:.1f} GB "
              f"in {ph['gen_s']:.1f} s, "
              f"peak {ph['peak_after_gen_gb']:.1f} GB", flush=True)
        if len(wf.layers) == cfg.num_hidden_layers:
            ctx = 2048 + 64
            caches = K.alloc_caches(cfg, 16 * 2176, dev)
            K.fill_random(caches, args.seed)
            steps = []
            for m in (1, 16):
                if time.time() - t_start > args.budget_s * 0.85:
                    break
                bt = make_batch(m, ctx, 16 * 2176, m, dev)
                ids = torch.arange(m, device=dev) * 7 + 11
                sync()
                reset_peak()
                t = time.perf_counter()
                logits = model.decode_step(cfg, wf, ids, bt, caches)
                sync()
                steps.append({"M": m, "ctx": ctx, "step_s": time.perf_counter() - t,
                              "peak_gb": peak_gb(),
                              "logits_shape": list(logits.shape),
                              "finite": bool(torch.isfinite(logits).all())})
                ph["steps"] = steps
                save()
                print(f"full step M={m}: {steps[-1]['step_s']:.2f} s peak {steps[-1]['peak_gb']:.1f} GB "
                      f"finite={steps[-1]['finite']}", flush=True)
    res["wall_s"] = time.time() - t_start
    save()
    print(json.dumps({k: v for k, v in res.items() if k != "phase1"}, indent=1)[:2000])


if __name__ == "__main__":
    sys.exit(main())
