"""Build upstream's GLM-5.3 MTP draft (the fork's NextN class) on CPU from the reference's tiny
checkpoint, as an EAGLE draft worker loads it, and run fused draft-decode steps through its
forward with upstream's own DSA pool (the draft's: one layer), ReqToTokenPool, ForwardBatch,
EagleDraftInput and logits processor; compare each step with the reference draft step
(``reference.mtp``). Run as a script, in its own process (see ``glm5_cpu_model.py``):

    python glm5_cpu_draft.py OUT.json PORT

The checkpoint's bf16 exclusions also name the draft's module paths (upstream's GLM NextN
loader leaves the checkpoint's ``model.layers.<N>`` exclusions unmapped, so they would not reach
``model.decoder``). Its config keeps GLM-5.3's ``index_share_for_mtp_iteration``: besides two
plain draft steps, two draft loops run as upstream's EAGLE worker runs them under it
(``reuse_dsa_topk_indices`` set, one ``EagleDraftInput`` carrying ``dsa_topk_indices``): one
seeded as draft-extend seeds it (physical slots, any order; the DSA backend's fused top-k on),
one without a seed (its first iteration runs the indexer).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from glm5_cpu_model import _kl, _max_rel, _paths, load, record_checkers, setup  # noqa: E402

EAGLE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


def draft_excludes(config):
    """Also keep the draft's bf16 modules bf16 under the names upstream's draft gives them."""
    layer = f"model.layers.{config['num_hidden_layers']}."
    names = config["quantization_config"]["modules_to_not_convert"]
    names += [n.replace(layer, "model.decoder.") for n in names if n.startswith(layer)]


def _install(hooks, model, hf_config):
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    log = logging.getLogger(hooks.__name__)
    log.addHandler(handler)
    try:
        hooks.install_fused_decode(model=model, hf_config=hf_config, capture_tail_hooks=[],
                                   is_draft=True)
    finally:
        log.removeHandler(handler)
    return records


def _attributes(model):
    """The draft-side attributes upstream_reads.OBJECT_ATTRIBUTES declares, read off the model
    upstream built (missing ones listed)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.models.glm5_mega.upstream_reads import OBJECT_ATTRIBUTES
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    import inspect

    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    objects = {
        "DeepseekV3ForCausalLMNextN": model, "DeepseekModelNextN": model.model,
        "DeepseekV2DecoderLayer": model.model.decoder, "RMSNorm": model.model.enorm,
        "nn.Linear (eh_proj)": model.model.eh_proj,
    }
    missing = [f"{kind}.{a}" for kind, obj in objects.items() for a in OBJECT_ATTRIBUTES[kind]
               if not hasattr(obj, a)]
    for cls in (ForwardBatch, EagleDraftInput):
        fields = cls.__dataclass_fields__
        missing += [f"{cls.__name__}.{a}" for a in OBJECT_ATTRIBUTES[cls.__name__]
                    if a not in fields]
    init = inspect.getsource(DeepseekSparseAttnBackend.__init__)
    missing += [f"DeepseekSparseAttnBackend.{a}" for a in OBJECT_ATTRIBUTES[
        "DeepseekSparseAttnBackend"] if f"self.{a} =" not in init]
    return missing


def main(out_path: str, port: int = 29518):
    _paths()
    import torch

    t0 = time.time()
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg, server_args = setup(Path(tmp), port, draft_excludes, EAGLE)
        model, model_config = load(server_args, cuda_structures=True, is_draft=True)
    hf = model_config.hf_config
    res["model_class"] = f"{type(model).__module__}.{type(model).__name__}"
    res["architectures"] = list(hf.architectures)
    res["build_s"] = time.time() - t0
    res["missing_attributes"] = _attributes(model)
    torch.manual_seed(0)

    from sglang.srt.layers.fused_decode import check as fused_check, draft, runtime, spec
    from sglang.srt.layers.fused_decode.reference import mtp as ref_mtp
    from sglang.srt.layers.fused_decode.reference.batch import RowBatch, prefill_batch
    from sglang.srt.layers.fused_decode.reference.cache import Caches
    from sglang.srt.layers.fused_decode.reference.weights import generate_weights
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.glm5_mega import adapt, hooks
    from sglang.srt.models.glm5_mega.glm5 import STATE_KEY, fused_mode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    ref_w = generate_weights(cfg, seed=0, mtp=True)
    mtp = ref_w.mtp
    # the EAGLE worker hands the target's embedding and LM head to the draft (upstream's
    # set_embed_and_head synchronizes CUDA, so the same swap by hand)
    res["loaded_embed_and_head"] = [torch.equal(model.model.embed_tokens.weight, ref_w.embed),
                                    torch.equal(model.lm_head.weight, ref_w.lm_head)]
    model.model.embed_tokens.weight.data = ref_w.embed.clone()
    model.lm_head.weight.data = ref_w.lm_head.clone()

    views, reasons = adapt.draft_weights(model, cfg)
    res["adapt_reasons"] = reasons
    res["weights_mismatched"] = [
        name for name in ("enorm", "hnorm", "eh_proj", "head_norm")
        if not torch.equal(getattr(views, name), getattr(mtp, name))
    ] + _layer_mismatches(views.layer, mtp.layer)

    # upstream's call on the draft runner, as a server with the flag makes it
    spec.BUILT_IMPLEMENTATIONS = frozenset({"triton"})
    hooks.fused_decode_backend = lambda: "triton"
    res["index_share"] = bool(getattr(hf, "index_share_for_mtp_iteration", False))
    res["install_log"] = _install(hooks, model, hf)
    state = model.__dict__[STATE_KEY]
    res["widths"] = {k: list(v) for k, v in state.plan.widths.items()}
    res["describe"] = state.plan.describe()
    res["pool_ids"] = {str(k): v for k, v in state.pool_ids.items()}
    res["branch_log"] = _branches(state, ForwardMode, fused_mode)

    # the draft worker's pool: its one layer at 0, with its index-K cache
    L = cfg.num_hidden_layers
    pool = DSATokenToKVPool(
        size=1024, page_size=64, kv_lora_rank=cfg.kv_lora_rank, dtype=torch.bfloat16,
        qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=1, device="cpu",
        index_head_dim=cfg.index_head_dim, enable_memory_saver=False,
        kv_cache_dim=cfg.kv_cache_dim, skip_topk_layers=[False])
    r2t = ReqToTokenPool(size=8, max_context_len=128, device="cpu", enable_memory_saver=False)
    caches = runtime.pool_caches(*adapt.pool_buffers(pool, [L], cfg, {L: 0}), cfg.kv_cache_dim)

    g = torch.Generator().manual_seed(2)
    # requests on shuffled 64-token pages (as upstream's paged allocator lays them out: position
    # p at offset p % 64 of its page); the third spans two pages; page 0 (slot 0) never used
    lengths = [21, 9, 70]
    pages, start, tables = torch.randperm(15, generator=g) + 1, 0, []
    for req, n in enumerate(lengths):
        used = -(-(n + 8) // 64)
        own = pages[start:start + used]
        start += used
        tables.append((own[:, None] * 64 + torch.arange(64)).flatten()[: n + 8])
        r2t.req_to_token[req + 1, : n + 8] = tables[-1].to(torch.int32)

    def hidden_like(rows):  # post-norm hidden states handed to the draft
        return torch.randn(rows, cfg.hidden_size, generator=g).to(torch.bfloat16)

    # the draft's context (its draft-extend), by the reference, into upstream's pool
    prompts = [torch.randint(2, cfg.vocab_size, (n,), generator=g) for n in lengths]
    _, _, extend_topk = ref_mtp.draft_step_topk(
        cfg, mtp, ref_w.embed, ref_w.lm_head, torch.cat(prompts), hidden_like(sum(lengths)),
        prefill_batch(tables, lengths), caches)
    # draft-extend's seed: the draft layer's top-k at each request's last row (positions)
    seed_pos = extend_topk[torch.tensor(lengths).cumsum(0) - 1]

    # the torch input path against upstream's own modules (their CPU forward)
    ids, prev = torch.randint(2, cfg.vocab_size, (5,), generator=g), hidden_like(5)
    nm = model.model
    with torch.no_grad():
        embeds = nm.embed_tokens(ids)
        upstream_in = nm.eh_proj(torch.cat((nm.enorm(embeds), nm.hnorm(prev)), dim=-1))
        ours = draft.eh_hidden(embeds, prev, views.enorm, views.hnorm, views.eh_proj,
                               cfg.rms_norm_eps)
        ref_in = ref_mtp.draft_input(cfg, mtp, ref_w.embed[ids], prev)
    res["eh_vs_upstream_rel"] = _max_rel(ours, upstream_in)
    res["eh_vs_reference_rel"] = _max_rel(ours, ref_in)

    checkers = record_checkers()

    def clone():
        return Caches(kv={k: v.clone() for k, v in caches.kv.items()},
                      index={k: v.clone() for k, v in caches.index.items()})

    layer = state.plan.layers[0]

    def step(rows_req, positions, input_ids, prev_hidden, num_real, spec_info=None,
             ref_carried=None, fused_topk=True):
        """One fused draft-decode step through model.forward (check mode on); the reference
        draft step on a copy of the pool, with the fused step's top-k and experts forced. With
        `spec_info` (a draft loop's, carrying the top-k) the step reuses it as upstream's draft
        loop does, and the reference attends `ref_carried` with its indexer skipped."""
        before = clone()
        share = spec_info is not None
        if not share:
            spec_info = EagleDraftInput()
        spec_info.hidden_states = prev_hidden
        layer.buf["scores"].fill_(float("nan"))
        req_idx = torch.tensor(rows_req, dtype=torch.int64)
        pos = torch.tensor(positions, dtype=torch.int64)
        out_loc = torch.stack([tables[r - 1][p] if r else torch.tensor(0)
                               for r, p in zip(rows_req, positions)]).long()
        seq_lens = pos.clamp_min(0) + 1
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=len(rows_req),
            input_ids=torch.tensor(input_ids), req_pool_indices=req_idx, seq_lens=seq_lens,
            out_cache_loc=out_loc, seq_lens_sum=int(seq_lens.sum()), positions=pos,
            num_token_non_padded=torch.tensor(num_real),
            capture_hidden_mode=CaptureHiddenMode.LAST, spec_info=spec_info,
            reuse_dsa_topk_indices=share)
        records = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())
        check_logger = logging.getLogger(fused_check.__name__)
        check_logger.addHandler(handler)
        os.environ[spec.CHECK_ENV] = "1"
        backend = types.SimpleNamespace(token_to_kv_pool=pool, req_to_token_pool=r2t,
                                        use_fused_topk=fused_topk)
        try:
            with forward_context(ForwardContext(attn_backend=backend)):
                out = model.forward(fb.input_ids, pos, fb)
        finally:
            os.environ.pop(spec.CHECK_ENV, None)
            check_logger.removeHandler(handler)
        valid = torch.arange(len(rows_req)) < num_real
        tabs = [tables[r - 1] if r else tables[0] for r in rows_req]
        width = max(t.numel() for t in tabs)
        slots = torch.stack([torch.nn.functional.pad(t, (0, width - t.numel()), value=-1)
                             for t in tabs])
        ref_pos = torch.where(valid, pos, torch.full_like(pos, -1))
        ck = checkers[-1]
        flips, seen = [0], []
        with fused_check.forced_topk(ck.topks, valid, seen), \
                fused_check.forced_experts(ck.experts, flips):
            ref_logits, ref_hidden, _ = ref_mtp.draft_step_topk(
                cfg, mtp, ref_w.embed, ref_w.lm_head, torch.tensor(input_ids), prev_hidden,
                RowBatch(ref_pos, slots), before, ref_carried)
        written = out_loc[valid]
        untouched = torch.ones(caches.kv[L].shape[0], dtype=torch.bool)
        untouched[written] = False
        pages = torch.ones(caches.index[L].shape[0], dtype=torch.bool)
        pages[written // 64] = False
        logits, hidden = out.next_token_logits, out.hidden_states
        return hidden, {
            "logits_rel": _max_rel(logits[valid], ref_logits[valid]),
            "kl_max": _kl(logits[valid], ref_logits[valid]),
            "argmax_equal": bool(torch.equal(logits[valid].argmax(-1),
                                             ref_logits[valid].argmax(-1))),
            # where they differ: the reference's own gap between the two choices, relative
            "argmax_gap_rel": _argmax_gap(logits[valid], ref_logits[valid]),
            "hidden_rel": _max_rel(hidden[valid], ref_hidden[valid]),
            "kv_written_rel": _max_rel(caches.kv[L][written], before.kv[L][written]),
            "kv_untouched_bitwise": torch.equal(caches.kv[L][untouched].view(torch.int16),
                                                before.kv[L][untouched].view(torch.int16)),
            "index_untouched_pages_bitwise": torch.equal(caches.index[L][pages],
                                                         before.index[L][pages]),
            "check_lines": records,
            "scores_written": not bool(layer.buf["scores"].isnan().all()),
            "index_untouched_bitwise": torch.equal(caches.index[L], before.index[L]),
            "indexer_ran": len(ck.topks) == 1,
            "carry": (spec_info.dsa_topk_indices[valid].tolist()
                      if share and spec_info.dsa_topk_indices is not None else None),
            "check_errors": ck.errors,
            "step_routing_flips": flips[0],
        }

    # draft step 1: 3 requests (first draft token after each prompt) and one padding row;
    # draft step 2 takes step 1's post-norm hidden state, one position further
    pad_prev = torch.cat([hidden_like(3), torch.zeros(1, cfg.hidden_size, dtype=torch.bfloat16)])
    first = [5, 6, 7, 0]
    hidden1, res["step1"] = step([1, 2, 3, 0], lengths + [0], first, pad_prev, 3)
    _, res["step2"] = step([1, 2, 3], [n + 1 for n in lengths], [8, 9, 10],
                           hidden1[:3].clone(), 3)

    # draft loops under index_share_for_mtp_iteration, three iterations each (upstream's
    # speculative_num_steps 3 runs two draft-decode forwards; three exercise one reuse more)
    reqs, n_req = [1, 2, 3], len(lengths)
    k = cfg.index_topk

    def loop(name, seed, ref_seed, fused_topk):
        info = EagleDraftInput(dsa_topk_indices=seed)
        prev, ids, carried = hidden_like(n_req), [11, 12, 13], ref_seed
        for i in range(3):
            out, res[f"{name}{i}"] = step(reqs, [n + i for n in lengths], ids, prev, n_req, info,
                                          carried, fused_topk)
            if carried is None:  # the first iteration ran the indexer: the loop carries its
                carried = torch.tensor(res[f"{name}{i}"]["carry"])  # (fused) top-k
            res[f"{name}{i}"]["expected_carry"] = carried.tolist()
            prev, ids = out.clone(), [20 + i] * n_req

    # seeded: draft-extend's top-k as upstream hands it on (slots, shuffled, int32)
    slots = torch.stack([torch.where(p >= 0, tables[r][p.clamp_min(0)], -1)
                         for r, p in enumerate(seed_pos)])
    shuffle = torch.stack([torch.randperm(k, generator=g) for _ in range(n_req)])
    loop("seeded", slots.gather(1, shuffle).to(torch.int32), seed_pos, True)
    loop("unseeded", None, None, True)
    res["seed_positions"] = seed_pos.tolist()
    res["steps_counted"] = state.steps
    res["total_s"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res, indent=1))


def _argmax_gap(logits, ref):
    """Largest reference logit gap (over max |ref|) between the reference's and the fused
    step's argmax, over rows where they differ (0 where none differ)."""
    mine, theirs = logits.argmax(-1), ref.argmax(-1)
    rows = (mine != theirs).nonzero().flatten()
    gaps = ref[rows, theirs[rows]] - ref[rows, mine[rows]]
    return float(gaps.max() / ref.abs().max()) if len(rows) else 0.0


def _layer_mismatches(view, ref):
    import torch

    bad = []

    def walk(a, b, name):
        if isinstance(a, torch.Tensor):
            if not torch.equal(a.float(), b.float()):
                bad.append(name)
        elif hasattr(a, "q") and hasattr(a, "s"):
            walk(a.q, b.q, name + ".q")
            walk(a.s, b.s, name + ".s")
        elif hasattr(a, "dequant"):  # a bf16 stand-in for an FP8 matrix
            walk(a.dequant(), b.dequant().to(torch.bfloat16), name)
        else:
            for f in getattr(a, "__dataclass_fields__", {}):
                walk(getattr(a, f), getattr(b, f), f"{name}.{f}")
    walk(view, ref, "decoder")
    return bad


def _branches(state, ForwardMode, fused_mode):
    out = {}
    for mode in ForwardMode:
        fb = types.SimpleNamespace(forward_mode=mode)
        out[mode.name] = [r for r in range(0, 20) if fused_mode(state, fb, r)]
    return out


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 29518)
