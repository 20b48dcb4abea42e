"""Reference RMSNorm, LayerNorm, rope and biased top-k routing against upstream SGLang's
torch-native implementations (skipped when upstream is not installed), plus their own semantics."""

import pytest
import torch

from sglang.srt.layers.fused_decode.reference import config as C
from sglang.srt.layers.fused_decode.reference import moe, ops


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_rms_norm_and_fused_add_match_upstream():
    ln = pytest.importorskip("sglang.srt.layers.layernorm", reason="upstream sglang not installed")
    g = _gen(0)
    x = torch.randn(5, 256, generator=g).bfloat16()
    r = (torch.randn(5, 256, generator=g) * 3).bfloat16()
    w = (1 + 0.1 * torch.randn(256, generator=g)).bfloat16()
    up = ln.RMSNorm(256, eps=1e-5)
    up.weight.data = w.float()  # the bf16 values, held fp32 as upstream's parameter
    assert torch.equal(ops.rms_norm(x, w, 1e-5, torch.bfloat16), up.forward_native(x))
    out, res = up.forward_native(x, r)
    ref_out, ref_res = ops.add_rms_norm(x, r, w, 1e-5, torch.bfloat16)
    assert torch.equal(ref_out, out) and torch.equal(ref_res, res)


def test_layer_norm_matches_upstream():
    ln = pytest.importorskip("sglang.srt.layers.layernorm", reason="upstream sglang not installed")
    g = _gen(1)
    x = torch.randn(7, 128, generator=g).bfloat16()
    up = ln.LayerNorm(128, eps=1e-6)
    up.weight.data = 1 + 0.1 * torch.randn(128, generator=g)
    up.bias.data = 0.05 * torch.randn(128, generator=g)
    assert torch.equal(ops.layer_norm(x.float(), up.weight, up.bias, 1e-6), up.forward_native(x.float()))


@pytest.mark.parametrize("theta", [1e4, 8e6])
def test_interleaved_rope_matches_upstream(theta):
    utils = pytest.importorskip("sglang.srt.layers.rotary_embedding.utils",
                                reason="upstream sglang not installed")
    g = _gen(2)
    pos = torch.tensor([0, 1, 17, 4095, 100000])
    x = torch.randn(5, 3, 64, generator=g)
    cos, sin = ops.rope_cos_sin(pos, 64, theta)
    up = utils.apply_rotary_emb(x, cos, sin, is_neox_style=False)
    assert torch.equal(ops.rope_interleaved(x, pos, theta), up)
    # the indexer's partial rope: first 64 of 128 dims rotated, the rest untouched
    x2 = torch.randn(5, 2, 128, generator=g)
    r2 = ops.rope_interleaved(x2, pos, theta, 64)
    assert torch.equal(r2[..., 64:], x2[..., 64:])
    assert torch.equal(r2[..., :64], utils.apply_rotary_emb(x2[..., :64], cos, sin, False))
    # pairs (2i, 2i+1) keep their norm; position 0 is the identity
    n = x.view(5, 3, 32, 2).norm(dim=-1)
    torch.testing.assert_close(ops.rope_interleaved(x, pos, theta).view(5, 3, 32, 2).norm(dim=-1), n)
    assert torch.equal(ops.rope_interleaved(x, pos, theta)[0], x[0])


def test_routing_matches_upstream_biased_topk():
    topk = pytest.importorskip("sglang.srt.layers.moe.topk", reason="upstream sglang not installed")
    cfg = C.glm53_config()
    g = _gen(3)
    logits = torch.randn(16, 256, generator=g) * 2
    bias = torch.randn(256, generator=g) * 0.1
    ids, w = moe.route(cfg, logits, bias)
    up_w, up_ids = topk.biased_grouped_topk_impl(
        torch.empty(16, 8), logits, bias, topk=8, renormalize=True, num_expert_group=1,
        topk_group=1, routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True,
    )
    order = up_ids.long().sort(dim=1)
    mine = ids.sort(dim=1)
    assert torch.equal(mine.values, order.values)
    torch.testing.assert_close(w.gather(1, mine.indices), up_w.gather(1, order.indices), rtol=1e-6, atol=0)


def test_routing_bias_chooses_and_scores_weigh():
    cfg = C.tiny_config()  # 16 experts, top 4
    logits = torch.zeros(1, 16)
    logits[0, :4] = 3.0  # experts 0-3 score highest without bias
    bias = torch.zeros(16)
    bias[8:12] = 10.0  # the bias alone moves the choice to 8-11
    ids, w = moe.route(cfg, logits, bias)
    assert sorted(ids[0].tolist()) == [8, 9, 10, 11]
    # weights come from the unbiased sigmoid scores, renormalized, times 2.5
    torch.testing.assert_close(w, torch.full((1, 4), 2.5 / 4))
    logits[0, 8] = 2.0
    ids, w = moe.route(cfg, logits, bias)
    s = torch.sigmoid(logits[0, ids[0]])
    torch.testing.assert_close(w[0], 2.5 * s / s.sum())
    assert w[0, ids[0].tolist().index(8)] > w[0, ids[0].tolist().index(9)]


def test_routing_ties_go_to_lower_expert_id():
    cfg = C.tiny_config()
    logits = torch.zeros(3, 16)  # all scores tie
    ids, _ = moe.route(cfg, logits, torch.zeros(16))
    assert ids.tolist() == [[0, 1, 2, 3]] * 3
    bias = torch.zeros(16)
    bias[[5, 9, 13]] = 0.5
    ids, _ = moe.route(cfg, logits, bias)
    assert ids[0].tolist() == [5, 9, 13, 0]
