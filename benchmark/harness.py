"""Shared machinery of the decode benchmarks: weights, caches, rows, arms, timing, output.

Weights: one TP rank's random GLM-5.3 layer from the reference generator
(`reference.weights.gen_layer`); q_a/kv_a and the dense gate/up are concatenated once into the
fused matrices SGLang holds, and the reference `LayerWeights` handed to the reference and fused
arms holds contiguous row slices of those (no weight stored twice). Experts stay in the
generator's contiguous per-expert stacks; arm (b) alone adds SGLang's stacked [E+1, 2I, H] copy.
Further layers of a kind are device copies of a
generated one (`clone_base`): distinct memory, so the L2 cannot serve a later layer from an
earlier one, and real bytes per step.

Timing: a CUDA graph of the whole stack of layers, replayed; the median replay over N events.
Bandwidth: a large device-to-device copy in the same run (bytes read + written / time).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from . import provenance
from . import roofline as RL
from .stock import Fp8, Rows, StockLayer, stock_layer_from

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ weights
def kind_of(cfg, layer_id: int) -> str:
    if not cfg.is_moe(layer_id):
        return "dense"
    return "moe_idx" if cfg.runs_indexer(layer_id) else "moe"


def layer_ids_of_kind(cfg, kind: str, n: int) -> List[int]:
    ids = [i for i in range(cfg.num_hidden_layers) if kind_of(cfg, i) == kind]
    return ids[:n]


def gen_base(cfg, layer_id: int, seed: int, tp: int, device) -> Dict[str, torch.Tensor]:
    """One rank's layer as flat tensors in SGLang's H200 layout (see the module docstring)."""
    from sglang.srt.layers.fused_decode.reference.weights import gen_layer

    lw = gen_layer(cfg, seed, layer_id, tp, 0, device)
    a = lw.attn
    b = {
        "input_norm": lw.input_norm, "post_norm": lw.post_attention_norm,
        "qkv_q": torch.cat([a.q_a.q, a.kv_a.q]), "qkv_s": torch.cat([a.q_a.s, a.kv_a.s]),
        "q_a_norm": a.q_a_norm, "kv_a_norm": a.kv_a_norm, "q_b_q": a.q_b.q, "q_b_s": a.q_b.s,
        "kv_b": a.kv_b, "o_q": a.o_proj.q, "o_s": a.o_proj.s,
    }
    if a.indexer is not None:
        ix = a.indexer
        b.update({
            "wq_b_q": ix.wq_b.q, "wq_b_s": ix.wq_b.s, "wk_q": ix.wk.q, "wk_s": ix.wk.s,
            "wproj": ix.weights_proj, "knw": ix.k_norm_weight, "knb": ix.k_norm_bias,
            "wkw": torch.cat([ix.wk.dequant(torch.float32).to(torch.bfloat16),
                              ix.weights_proj.to(torch.bfloat16)]).contiguous(),
        })
    m = lw.mlp
    if lw.is_moe:
        b.update({"router": m.router, "bias": m.bias, "gate_q": m.gate.q, "gate_s": m.gate.s,
                  "up_q": m.up.q, "up_s": m.up.s, "down_q": m.down.q, "down_s": m.down.s,
                  "sg_q": m.shared.gate.q, "sg_s": m.shared.gate.s, "su_q": m.shared.up.q,
                  "su_s": m.shared.up.s, "sd_q": m.shared.down.q, "sd_s": m.shared.down.s})
    else:
        b.update({"w13_q": torch.cat([m.gate.q, m.up.q]), "w13_s": torch.cat([m.gate.s, m.up.s]),
                  "down_q": m.down.q, "down_s": m.down.s})
    del lw
    return b


def clone_base(base: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in base.items()}


def assemble(cfg, layer_id: int, b: Dict[str, torch.Tensor]):
    """(reference LayerWeights holding views of b, StockLayer) for layer `layer_id`."""
    from sglang.srt.layers.fused_decode.reference.quant import Fp8Weight
    from sglang.srt.layers.fused_decode.reference.weights import (
        AttentionWeights, DenseMlpWeights, IndexerWeights, LayerWeights, MoeWeights)

    ql = cfg.q_lora_rank
    assert ql % 128 == 0
    qs = ql // 128
    indexer = None
    if "wq_b_q" in b:
        indexer = IndexerWeights(Fp8Weight(b["wq_b_q"], b["wq_b_s"]), Fp8Weight(b["wk_q"], b["wk_s"]),
                                 b["wproj"], b["knw"], b["knb"])
    attn = AttentionWeights(
        q_a=Fp8Weight(b["qkv_q"][:ql], b["qkv_s"][:qs]), q_a_norm=b["q_a_norm"],
        kv_a=Fp8Weight(b["qkv_q"][ql:], b["qkv_s"][qs:]), kv_a_norm=b["kv_a_norm"],
        q_b=Fp8Weight(b["q_b_q"], b["q_b_s"]), kv_b=b["kv_b"],
        o_proj=Fp8Weight(b["o_q"], b["o_s"]), indexer=indexer)
    W = lambda k: Fp8Weight(b[k + "_q"], b[k + "_s"])  # noqa: E731
    dense_w13 = None
    if "router" in b:
        mlp = MoeWeights(router=b["router"], bias=b["bias"], gate=W("gate"), up=W("up"),
                         down=W("down"), shared=DenseMlpWeights(W("sg"), W("su"), W("sd")))
    else:
        w13_q, w13_s = b["w13_q"], b["w13_s"]
        it = w13_q.shape[0] // 2
        sb = it // 128
        mlp = DenseMlpWeights(Fp8Weight(w13_q[:it], w13_s[:sb]), Fp8Weight(w13_q[it:], w13_s[sb:]),
                              W("down"))
        dense_w13 = Fp8(w13_q, w13_s)
    lw = LayerWeights(layer_id, b["input_norm"], b["post_norm"], attn, mlp)
    sl = stock_layer_from(cfg, lw, Fp8(b["qkv_q"], b["qkv_s"]), dense_w13)
    if "wkw" in b:
        sl.idx_wkw = b["wkw"]
    return lw, sl


# ------------------------------------------------------------------ caches and rows
def make_caches(cfg, layer_ids, num_slots: int, device):
    """Reference caches for `layer_ids`, filled with random valid values (never zeros)."""
    from sglang.srt.layers.fused_decode.reference.cache import alloc_caches

    c = alloc_caches(cfg, num_slots, device, torch.bfloat16, layers=layer_ids)
    g = torch.Generator(device=device).manual_seed(1234)
    for kv in c.kv.values():
        kv.normal_(0.0, 1.0, generator=g)
    for ic in c.index.values():
        pages = ic.shape[0]
        keys = ic[:, : 64 * 128]
        for p0 in range(0, pages, 1024):
            r = torch.randn(min(1024, pages - p0), 64 * 128, device=device, generator=g)
            keys[p0 : p0 + r.shape[0]] = (r * 2.0).to(torch.float8_e4m3fn).view(torch.uint8)
        scales = ic[:, 64 * 128 :].view(torch.float32)
        scales.uniform_(0.5, 1.5, generator=g)
    return c


def make_batch(m: int, ctx: int, device, width: int = 0):
    """M requests of context ctx (the new token included), request i in slots [i*ctx, (i+1)*ctx);
    width: the slot table's columns (default ctx; a server's table spans its longest
    context), slot 0 past the context."""
    from sglang.srt.layers.fused_decode.reference.batch import RowBatch

    slots = torch.arange(m * ctx, dtype=torch.int64, device=device).view(m, ctx)
    if width > ctx:
        slots = torch.cat([slots, slots.new_zeros(m, width - ctx)], dim=1)
    pos = torch.full((m,), ctx - 1, dtype=torch.int64, device=device)
    return RowBatch(pos, slots)


def pool_batch(batch, width: int, dtype=torch.int32):
    """batch's rows with their slots in a server's pool table `width` positions wide (at
    least the batch's; ``testing.in_a_pool``)."""
    from sglang.srt.layers.fused_decode.testing import in_a_pool

    return in_a_pool(batch, 0, max(width - batch.token_slots.shape[1], 0), dtype)


def layer_inputs(cfg, m: int, ctx: int, device):
    """(hidden, residual, the previous layer's top-k) of a layer benchmark's step of m rows at
    context ctx: every layer benchmark takes these, so tiling_probe's baseline routes as
    decode_layer's table does (the same experts touched) and reads against its floor."""
    g = torch.Generator(device=device).manual_seed(m * 1000 + ctx)
    hid = torch.randn(m, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    res = torch.randn(m, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    return hid, res, random_topk(cfg, m, ctx, device)


def experts_touched(layers, m: int) -> Optional[float]:
    """The mean number of distinct routed experts the last step of m rows chose in each MoE
    layer of `layers` (fused layers: ``routed_experts``; reads them back, so not while
    timing); None where none is a MoE layer."""
    counts = []
    for layer in layers:
        if getattr(layer, "experts", False):
            chosen = layer.routed_experts(m)
            counts.append(int(torch.unique(chosen[chosen >= 0]).numel()))
    return sum(counts) / len(counts) if counts else None


def random_topk(cfg, m: int, ctx: int, device, seed: int = 7):
    """A previous layer's top-k for a 'shared' layer: index_topk distinct positions per row."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = cfg.index_topk
    rows = []
    for _ in range(m):
        if ctx >= k:
            rows.append(torch.randperm(ctx, generator=g)[:k].sort().values)
        else:
            rows.append(torch.cat([torch.arange(ctx), torch.full((k - ctx,), -1)]))
    return torch.stack(rows).to(device)


# ------------------------------------------------------------------ measurement
def measure_bandwidth(device, nbytes: int = 4 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), median of reps."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    a.random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def time_graph(fn: Callable[[], None], replays: int = 30, warmup: int = 3):
    """(median us, all us) of CUDA-graph replays of fn (fn already ran once eagerly)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(warmup):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(replays)]
    for e0, e1 in ev:
        e0.record()
        g.replay()
        e1.record()
    torch.cuda.synchronize()
    us = [e0.elapsed_time(e1) * 1e3 for e0, e1 in ev]
    del g
    return statistics.median(us), us


# ------------------------------------------------------------------ fused arm
def fused_builder():
    """(build_fused_layer or None, reason) from the project's fused module, per its contract."""
    try:
        from sglang.srt.layers.fused_decode import layer as fl

        return fl.build_fused_layer, "present"
    except (ImportError, AttributeError) as e:
        return None, f"absent ({type(e).__name__}: {e})"


# ------------------------------------------------------------------ run metadata and output
def git_commit() -> str:
    """BENCH_COMMIT when set (the device's copy of the tree is a snapshot whose own HEAD is
    not a commit of this repository), else the checkout's HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=REPO, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return os.environ.get("BENCH_COMMIT", "unknown")


def portable(value: str) -> str:
    """A path as committed files may hold it: repo-relative, $OUT for the device's out folder."""
    if not value:
        return value
    out = os.environ.get("OUT")
    if out and str(value).startswith(out):
        return "$OUT" + str(value)[len(out):]
    try:
        return str(Path(value).resolve().relative_to(REPO))
    except ValueError:
        return Path(value).name


def portable_args(args) -> dict:
    return {k: portable(v) if k in ("out", "results", "upstream_dir") else v
            for k, v in vars(args).items()}


def run_meta(device) -> dict:
    import triton

    p = torch.cuda.get_device_properties(device)
    return {
        "commit": git_commit(),
        # the files the run read, hashed as git does: the test of the results checks that the
        # commit named is the tree that ran (provenance.py)
        "tree_digest": provenance.tree_digest(REPO),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(device), "sms": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None), "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        # the kernels' knobs set from the environment (a form opted in or out for the run)
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SGL_KERNEL_EXT_")},
    }


def result_row(arm: str, kind: str, m: int, ctx: int, us: Optional[float], floor_bytes: float,
               bw: float, stock_us: Optional[float], **extra) -> dict:
    floor = RL.floor_us(floor_bytes, bw)
    row = {"key": f"{arm}/{kind}/M{m}/L{ctx}", "arm": arm, "kind": kind, "M": m, "L": ctx,
           "floor_bytes": floor_bytes, "floor_us": floor, "us": us}
    if us:
        row.update({"achieved_TBps": floor_bytes / (us * 1e-6) / 1e12,
                    "fraction_of_floor": floor / us,
                    "speedup_vs_stock": (stock_us / us) if stock_us else None})
    row.update(extra)
    return row


def stamp_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def write_json(name: str, payload: dict, out_dirs, stamp: Optional[str] = None) -> List[Path]:
    stamp = stamp or stamp_now()
    paths = []
    for d in out_dirs:
        if not d:
            continue
        d = Path(d)
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{name}_{stamp}.json"
        p.write_text(json.dumps(payload, indent=1, default=str))
        paths.append(p)
    return paths


def markdown_table(rows: List[dict], arms: List[str]) -> str:
    """One line per (kind, L, M): floor, then per arm us / fraction of floor / speedup."""
    head = "| kind | L | M | floor us | " + " | ".join(
        f"{a} us | {a} TB/s | {a} frac | {a} x stock" for a in arms) + " |"
    sep = "|" + "---|" * (4 + 4 * len(arms))
    out = [head, sep]
    keys = sorted({(r["kind"], r["L"], r["M"]) for r in rows},
                  key=lambda k: (RL.LAYER_KINDS.index(k[0]) if k[0] in RL.LAYER_KINDS else 9, k[1], k[2]))
    by = {(r["arm"], r["kind"], r["L"], r["M"]): r for r in rows}
    for k in keys:
        floor = next(r["floor_us"] for r in rows if (r["kind"], r["L"], r["M"]) == k)
        cells = []
        for a in arms:
            r = by.get((a,) + k)
            if not r or not r.get("us"):
                cells += ["-", "-", "-", "-"]
                continue
            sp = r.get("speedup_vs_stock")
            cells += [f"{r['us']:.1f}", f"{r['achieved_TBps']:.2f}", f"{r['fraction_of_floor']:.2f}",
                      f"{sp:.2f}" if sp else "-"]
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | {floor:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def log(msg: str, t0=[time.time()]):
    print(f"[{time.time() - t0[0]:7.1f}s] {msg}", flush=True)
