"""Build upstream's GLM-5.3 model (the fork's class) on CPU from the reference's tiny
checkpoint, and run fused steps through its forward with upstream's own DSA pool,
ReqToTokenPool and ForwardBatch; compare with the reference. Run as a script (it publishes
upstream's process-wide context and a one-rank gloo group, so it runs in its own process):

    python glm5_cpu_model.py OUT.json

Upstream builds on CPU with three stand-ins for what only a GPU answers: the device
capability (9, 0) and, in its rope factory, the non-CPU rope class with its torch path. The
model is built twice: as on CPU, and with the module forms CUDA takes (the indexer's merged
bf16 wk_weights_proj, the shared expert fused into FusedMoE); the steps run on the second.
"""

import json
import logging
import os
import sys
import tempfile
import time
import types
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
REPO = Path(__file__).resolve().parents[3]


def _paths():
    import sglang

    overlay = str(REPO / "python" / "sglang")
    if overlay not in sglang.__path__:
        sglang.__path__.insert(0, overlay)
    sys.path.insert(0, str(REPO / "sgl-kernel-ext"))


def setup(workdir: Path, port: int, edit_config=None, extra_args=()):
    """The tiny checkpoint, upstream's resolved arguments, published context and TP group
    (edit_config: a function that edits the checkpoint's config.json dict in place;
    extra_args: more server arguments)."""
    import torch

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    from sglang.srt.layers.fused_decode.reference.checkpoint import write_checkpoint
    from sglang.srt.layers.fused_decode.reference.config import tiny_config

    cfg = tiny_config()
    ckpt = workdir / "ckpt"
    write_checkpoint(cfg, ckpt, 0, mtp=True)
    if edit_config is not None:
        config = json.loads((ckpt / "config.json").read_text())
        edit_config(config)
        (ckpt / "config.json").write_text(json.dumps(config, indent=1))
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(["--model-path", str(ckpt), "--device", "cpu",
                                       *extra_args])
    server_args.resolve_once()
    from sglang.srt.runtime_context import SpawnRanks, publish

    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel()
    import sglang.srt.layers.rotary_embedding.base as rope_base
    import sglang.srt.layers.rotary_embedding.factory as rope_factory

    rope_base._is_cpu = True  # the torch rope path, not vllm's op
    rope_factory.get_rope_cpu = (
        lambda head, rot, max_pos, base, neox, scaling, dtype, partial, device:
        rope_factory.get_rope(head, rot, max_pos, base, neox, scaling, dtype, partial))
    return cfg, server_args


def load(server_args, cuda_structures: bool, is_draft: bool = False):
    """Upstream's loader builds the architecture's class and loads the checkpoint (is_draft:
    the MTP draft, as a draft worker loads it). With cuda_structures, the modules take the
    forms they take on CUDA: the indexer's merged bf16 wk_weights_proj and the shared expert
    fused into FusedMoE as its last expert."""
    import sglang.srt.layers.attention.dsa.dsa_indexer as dsa_indexer
    import sglang.srt.models.deepseek_nextn as deepseek_nextn
    import sglang.srt.models.deepseek_v2 as deepseek_v2
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model

    saved = (dsa_indexer._is_cuda, getattr(dsa_indexer, "resolve_num_sms", None),
             deepseek_v2.get_num_fused_shared_experts, deepseek_nextn.get_num_fused_shared_experts)
    if cuda_structures:
        dsa_indexer._is_cuda = True  # only __init__'s choices run: no CUDA kernel is called
        dsa_indexer.resolve_num_sms = lambda *a, **k: 132
        deepseek_v2.get_num_fused_shared_experts = lambda: 1
        deepseek_nextn.get_num_fused_shared_experts = lambda: 1  # the draft reads its own
    try:
        model_config = ModelConfig.from_server_args(server_args, is_draft_model=is_draft)
        model = get_model(model_config=model_config, load_config=LoadConfig(load_format="auto"),
                          device_config=DeviceConfig("cpu"))
    finally:
        (dsa_indexer._is_cuda, dsa_indexer.resolve_num_sms,
         deepseek_v2.get_num_fused_shared_experts,
         deepseek_nextn.get_num_fused_shared_experts) = saved
    return model, model_config


def record_checkers() -> list:
    """The check mode's Checkers made from now on, in the list returned (the fused step makes
    one per step in check mode)."""
    from sglang.srt.layers.fused_decode import check as fused_check

    made = []

    class RecordingChecker(fused_check.Checker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    fused_check.Checker = RecordingChecker
    return made


def _max_rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _kl(logits, ref):
    import torch

    p = torch.log_softmax(ref.float(), -1)
    q = torch.log_softmax(logits.float(), -1)
    return float((p.exp() * (p - q)).sum(-1).max())


def main(out_path: str, port: int = 29517):
    _paths()
    import torch

    t0 = time.time()
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg, server_args = setup(Path(tmp), port)
        cpu_model, _ = load(server_args, cuda_structures=False)
        model, model_config = load(server_args, cuda_structures=True)
    res["model_class"] = f"{type(model).__module__}.{type(model).__name__}"
    res["build_s"] = time.time() - t0
    res["cuda_structures"] = {
        "indexer_wk_weights_proj": hasattr(model.model.layers[1].self_attn.indexer,
                                           "wk_weights_proj"),
        "fused_shared_expert": int(model.model.layers[1].mlp.num_fused_shared_experts),
    }

    from sglang.srt.layers.fused_decode import runtime
    from sglang.srt.layers.fused_decode.reference import model as ref_model
    from sglang.srt.layers.fused_decode.reference.batch import RowBatch
    from sglang.srt.layers.fused_decode.reference.cache import Caches
    from sglang.srt.layers.fused_decode.reference.weights import generate_weights, tensor_bytes
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.glm5_mega import adapt, hooks

    ref_w = generate_weights(cfg, seed=0)
    res["cpu_structures"] = _compare_views(cpu_model, cfg, ref_w, adapt)
    res.update(_compare_views(model, cfg, ref_w, adapt))
    del cpu_model


    # upstream's call (patch 0004) as a server with the flag makes it; this server has no
    # speculation, so only decode is covered
    from sglang.srt.layers.fused_decode import spec

    spec.BUILT_IMPLEMENTATIONS = frozenset({"triton"})
    hooks.fused_decode_backend = lambda: "triton"
    hooks.install_fused_decode(model=model, hf_config=model_config.hf_config,
                               capture_tail_hooks=[], is_draft=False)
    installed = model.__dict__["_fused_decode"]
    res["install_widths"] = {k: list(v) for k, v in installed.plan.widths.items()}
    # the MTP target: verify steps of whole requests of 2 draft tokens
    state = hooks.build_fused_state(
        model, model_config.hf_config, speculative_algorithm="EAGLE", draft_tokens=2,
        context_len=112, rank=0, reduce=lambda y: y, is_capturing=lambda: False)
    res["widths"] = {k: list(v) for k, v in state.plan.widths.items()}
    res["describe"] = state.plan.describe()
    res["derived_bytes"] = state.plan.derived_bytes

    pool = DSATokenToKVPool(
        size=1024, page_size=64, kv_lora_rank=cfg.kv_lora_rank, dtype=torch.bfloat16,
        qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=cfg.num_hidden_layers, device="cpu",
        index_head_dim=cfg.index_head_dim, enable_memory_saver=False,
        kv_cache_dim=cfg.kv_cache_dim,
        skip_topk_layers=[not cfg.runs_indexer(i) for i in range(cfg.num_hidden_layers)])
    r2t = ReqToTokenPool(size=8, max_context_len=128, device="cpu", enable_memory_saver=False)
    ids = list(range(cfg.num_hidden_layers))
    pool_caches = runtime.pool_caches(*adapt.pool_buffers(pool, ids, cfg), cfg.kv_cache_dim)

    g = torch.Generator().manual_seed(1)
    lengths = [21, 9, 30]
    perm = torch.randperm(1024, generator=g)[:sum(n + 8 for n in lengths)] + 64  # never slot 0
    tables, start = [], 0
    for req, n in enumerate(lengths):
        t = perm[start:start + n + 8]
        start += n + 8
        tables.append(t)
        r2t.req_to_token[req + 1, : n + 8] = t.to(torch.int32)  # request pool index req + 1
    prompts = [torch.randint(2, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    prefill_logits = ref_model.prefill(cfg, ref_w, prompts, tables, pool_caches)
    next_ids = [int(lg[-1].argmax()) for lg in prefill_logits]

    def clone_pool():
        return Caches(kv={k: v.clone() for k, v in pool_caches.kv.items()},
                      index={k: v.clone() for k, v in pool_caches.index.items()})

    from sglang.srt.layers.fused_decode import check as fused_check

    checkers = record_checkers()

    def step(mode, rows_req, positions, input_ids, num_real, check_mode=True):
        """One fused step through model.forward; the reference on a copy of the pool."""
        before = clone_pool()
        req_idx = torch.tensor(rows_req, dtype=torch.int64)
        bs = len(set(rows_req))
        pos = torch.tensor(positions, dtype=torch.int64)
        out_loc = torch.stack([tables[r - 1][p] if r else torch.tensor(0)
                               for r, p in zip(rows_req, positions)]).long()
        uniq = torch.tensor(sorted(set(rows_req), key=rows_req.index), dtype=torch.int64)
        seq_lens = torch.tensor([max(p for r, p in zip(rows_req, positions) if r == q) + 1
                                 for q in uniq.tolist()], dtype=torch.int64)
        per_req = len(rows_req) // bs
        fb = ForwardBatch(
            forward_mode=mode, batch_size=bs, input_ids=torch.tensor(input_ids),
            req_pool_indices=uniq if mode.is_target_verify() else req_idx,
            seq_lens=seq_lens, out_cache_loc=out_loc, seq_lens_sum=int(seq_lens.sum()),
            positions=pos, num_token_non_padded=torch.tensor(num_real),
            capture_hidden_mode=CaptureHiddenMode.NULL)
        if check_mode:
            os.environ["SGLANG_FUSED_DECODE_CHECK"] = "1"
        records = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())
        logging.getLogger("sglang.srt.layers.fused_decode.check").addHandler(handler)
        backend = types.SimpleNamespace(token_to_kv_pool=pool, req_to_token_pool=r2t)
        check_logger = logging.getLogger("sglang.srt.layers.fused_decode.check")
        try:
            with forward_context(ForwardContext(attn_backend=backend)):
                out = model.forward(fb.input_ids, pos, fb)
        finally:
            os.environ.pop("SGLANG_FUSED_DECODE_CHECK", None)
            check_logger.removeHandler(handler)
        logits = out.next_token_logits
        valid = torch.arange(len(rows_req)) < num_real
        tabs = [tables[r - 1] if r else tables[0] for r in rows_req]
        width = max(t.numel() for t in tabs)
        slots = torch.stack([torch.nn.functional.pad(t, (0, width - t.numel()), value=-1)
                             for t in tabs])
        ref_pos = torch.where(valid, pos, torch.full_like(pos, -1))
        ref_caches = before
        ck = checkers[-1]  # the fused step's choices, forced on the reference step
        flips, seen = [0], []
        with fused_check.forced_topk(ck.topks, valid, seen), \
                fused_check.forced_experts(ck.experts, flips):
            ref_logits = ref_model.decode_step(cfg, ref_w, torch.tensor(input_ids),
                                               RowBatch(ref_pos, slots), ref_caches)
        written = out_loc[valid]
        kv_rel = max(_max_rel(pool_caches.kv[i][written], ref_caches.kv[i][written])
                     for i in ids)
        untouched = torch.ones(pool_caches.kv[0].shape[0], dtype=torch.bool)
        untouched[written] = False
        same = all(torch.equal(pool_caches.kv[i][untouched].view(torch.int16),
                               before.kv[i][untouched].view(torch.int16)) for i in ids)
        pages = torch.ones(pool_caches.index[0].shape[0], dtype=torch.bool)
        pages[written // 64] = False
        same_pages = all(torch.equal(pool_caches.index[i][pages], before.index[i][pages])
                         for i in pool_caches.index)
        return {
            "rows": len(rows_req),
            "logits_rel": _max_rel(logits[valid], ref_logits[valid]),
            "kl_max": _kl(logits[valid], ref_logits[valid]),
            "argmax_equal": bool(torch.equal(logits[valid].argmax(-1),
                                             ref_logits[valid].argmax(-1))),
            "kv_written_rel": kv_rel,
            "kv_untouched_bitwise": same,
            "index_untouched_pages_bitwise": same_pages,
            "check_lines": records,
            "check_errors": ck.errors,
            "step_routing_flips": flips[0],
            "step_topk_overlap": min(
                float((torch.isin(f[valid], o[valid]) | (f[valid] < 0)).float().mean())
                for f, o in zip(ck.topks, seen)),
        }

    # decode: 3 requests and one CUDA-graph padding row
    res["decode"] = step(ForwardMode.DECODE, [1, 2, 3, 0], lengths + [0], next_ids + [0], 3)
    res["branch_log"] = _branches(state, ForwardMode)
    # target verify: 2 requests x 2 draft tokens, after the decode step above
    p1, p2 = lengths[0] + 1, lengths[2] + 1
    res["target_verify"] = step(ForwardMode.TARGET_VERIFY, [1, 1, 3, 3],
                                [p1, p1 + 1, p2, p2 + 1], [5, 6, 7, 8], 4)
    res["total_s"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res, indent=1))


def _compare_views(model, cfg, ref_w, adapt):
    """The adapter's views of the loaded parameters against the checkpoint's weights."""
    import torch

    views, reasons = adapt.model_weights(model, cfg)
    mismatched, shared = [], 0
    params = {p.data_ptr() for p in model.parameters()}
    for lw, rw in zip(views, [ref_w.layers[i] for i in sorted(ref_w.layers)]):
        def walk(a, b, name):
            nonlocal shared
            if isinstance(a, torch.Tensor):
                if not torch.equal(a.float(), b.float()):
                    mismatched.append(name)
                return
            if hasattr(a, "q") and hasattr(a, "s"):
                walk(a.q, b.q, name + ".q")
                walk(a.s, b.s, name + ".s")
                shared += a.q.untyped_storage().data_ptr() in params
                return
            if hasattr(a, "dequant"):  # a bf16 stand-in
                walk(a.dequant(), b.dequant().to(torch.bfloat16), name)
                return
            for f in getattr(a, "__dataclass_fields__", {}):
                walk(getattr(a, f), getattr(b, f), f"{name}.{f}")
        walk(lw, rw, f"layer{lw.layer_id}")
    return {"adapt_reasons": reasons, "weights_mismatched": mismatched,
            "fp8_views_of_loaded_storage": shared,
            "fp8_matrices": sum(1 for lw in views for _ in _fp8s(lw))}


def _fp8s(lw):
    stack = [lw]
    while stack:
        a = stack.pop()
        if hasattr(a, "q") and hasattr(a, "s"):
            yield a
        else:
            stack += [getattr(a, f) for f in getattr(a, "__dataclass_fields__", {})]


def _branches(state, ForwardMode):
    from sglang.srt.models.glm5_mega.glm5 import fused_mode

    class FB:
        def __init__(self, mode):
            self.forward_mode = mode

    out = {}
    for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND,
                 ForwardMode.MIXED, ForwardMode.IDLE, ForwardMode.DRAFT_EXTEND_V2):
        out[mode.name] = [r for r in range(0, 20) if fused_mode(state, FB(mode), r)]
    return out


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 29517)
