"""CPU checks of the benchmark arms' own kernels (Triton interpreter, tiny shapes).

The stock arm's kernels are compared with the reference ops on the same inputs where the
interpreter's arithmetic is trustworthy (index math, masking, softmax, routing); FP8 casts are
not compared tightly here (the interpreter rounds some fp32 -> e4m3 casts wrongly, see
docs/DESIGN.md), the GPU run's `--check` does that. Also checks the one-launch MoE alignment
that stands in for SGLang's CUDA `moe_align_block_size` in arm (b).
"""

import pytest
import torch

triton = pytest.importorskip("triton")

from benchmark import harness as H  # noqa: E402
from benchmark import stock_kernels as K  # noqa: E402
from benchmark import upstream  # noqa: E402
from benchmark.stock import Rows  # noqa: E402
from sglang.srt.layers.fused_decode.reference import attention as A  # noqa: E402
from sglang.srt.layers.fused_decode.reference import cache as C  # noqa: E402
from sglang.srt.layers.fused_decode.reference import moe as MO  # noqa: E402
from sglang.srt.layers.fused_decode.reference import ops as O  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import tiny_config  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter checks")


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def test_align_groups_pairs_by_expert():
    ids = torch.tensor([[3, 1, 5, 16], [1, 2, 3, 16], [7, 3, 9, 16]], dtype=torch.int32)
    sorted_ids, eids, ntpp = upstream.align(ids, 16)
    flat = ids.flatten()
    groups = sorted(set(flat.tolist()))
    assert int(ntpp) == 16 * len(groups)
    assert eids[: len(groups)].tolist() == groups and (eids[len(groups):] == -1).all()
    blocks = sorted_ids.view(-1, 16)
    for b, e in enumerate(groups):
        got = [int(p) for p in blocks[b] if p < flat.numel()]
        assert got == [i for i in range(flat.numel()) if int(flat[i]) == e]
    assert (blocks[len(groups):] == flat.numel()).all()


def test_route_matches_reference():
    cfg = tiny_config()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, cfg.n_routed_experts, generator=g)
    bias = 0.1 * torch.randn(cfg.n_routed_experts, generator=g)
    ids, w, table = K.route(logits, bias, cfg.num_experts_per_tok, cfg.routed_scaling_factor)
    ids_r, w_r = MO.route(cfg, logits, bias)
    assert torch.equal(ids[:, :-1].long(), ids_r) and (ids[:, -1] == cfg.n_routed_experts).all()
    assert torch.allclose(w[:, :-1], w_r, rtol=1e-5) and (w[:, -1] == 1.0).all()
    for m in range(5):
        for j, e in enumerate(ids[m].tolist()):
            assert int(table[m, e]) == j
        assert int((table[m] >= 0).sum()) == cfg.num_experts_per_tok + 1


def test_attention_and_index_kernels_match_reference():
    cfg = tiny_config()
    m, ctx, lid = 3, 40, 1
    torch.manual_seed(0)
    caches = H.make_caches(cfg, [lid], 128, "cpu")
    batch = H.make_batch(m, ctx, "cpu")
    rows = Rows.from_batch(batch)
    heads, kvl = 4, cfg.kv_lora_rank
    q_lat = torch.randn(m, heads, kvl).to(torch.bfloat16)
    q_pe = torch.randn(m, heads, cfg.qk_rope_head_dim).to(torch.bfloat16)
    topk = H.random_topk(cfg, m, ctx, "cpu")
    topk[0, 5:] = -1
    kv = caches.kv[lid]
    o = K.sparse_mla(q_lat * 4, q_pe, kv, topk, rows.token_slots, cfg.softmax_scale)
    assert rel(o, A.sparse_mla(cfg, q_lat * 4, q_pe, batch, kv, topk)) < 1e-2

    ni, di = 4, cfg.index_head_dim
    q8 = (torch.randn(m, ni, di) * 50).to(torch.float8_e4m3fn)
    hw = torch.rand(m, ni)
    ic = caches.index[lid]
    sc = K.index_logits(q8, hw, ic, rows.token_slots, rows.seq_lens - 7, ctx)
    keys, scales = C.gather_index(ic, rows.token_slots)
    ref = torch.einsum("mh,mhl->ml", hw, torch.einsum("mhd,mld->mhl", q8.float(), keys).relu()) * scales
    live = torch.arange(ctx) < (rows.seq_lens - 7).unsqueeze(1)
    assert torch.isinf(sc[~live]).all() and rel(sc[live], ref[live]) < 1e-5

    qkv = torch.randn(m, cfg.q_lora_rank + cfg.kv_cache_dim).to(torch.bfloat16)
    qn = (1 + 0.1 * torch.randn(cfg.q_lora_rank)).to(torch.bfloat16)
    kvn = (1 + 0.1 * torch.randn(kvl)).to(torch.bfloat16)
    cache = kv.clone()
    cq = K.latent_post(qkv, qn, kvn, cache, rows.out_slots, rows.positions, cfg.rms_norm_eps,
                       cfg.rope_theta, cfg.q_lora_rank, kvl, cfg.qk_rope_head_dim)
    ql = cfg.q_lora_rank
    assert rel(cq, O.rms_norm(qkv[:, :ql], qn, cfg.rms_norm_eps, torch.bfloat16)) < 1e-2
    ckv = O.rms_norm(qkv[:, ql:ql + kvl], kvn, cfg.rms_norm_eps, torch.bfloat16)
    kpe = O.rope_interleaved(qkv[:, ql + kvl:], batch.rope_positions, cfg.rope_theta)
    assert rel(cache[rows.out_slots], torch.cat([ckv, kpe.to(torch.bfloat16)], 1)) < 1e-2


def test_a_wide_slot_table_keeps_the_context_and_pads_past_it():
    """make_batch's width: a server-like slot table, the context's slots first, slot 0 after."""
    narrow, wide = H.make_batch(3, 40, "cpu"), H.make_batch(3, 40, "cpu", width=100)
    assert wide.token_slots.shape == (3, 100)
    assert torch.equal(wide.token_slots[:, :40], narrow.token_slots)
    assert not wide.token_slots[:, 40:].any() and torch.equal(wide.positions, narrow.positions)
