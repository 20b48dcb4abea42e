"""Upstream's loaded GLM-5.3 modules as the fused runtime's plain weights and caches.

``layer_weights`` makes the reference's ``LayerWeights`` of one TP rank out of VIEWS of the
parameters upstream loaded (nothing is copied): q_a / kv_a are the row blocks of
``fused_qkv_a_proj_with_mqa``, gate / up the row blocks of ``gate_up_proj`` and of FusedMoE's
``w13_weight`` (the shared expert is either ``shared_experts`` or, fused, the last expert of
``w13_weight`` / ``w2_weight``), kv_b is ``kv_b_proj.weight`` (kept after w_kc / w_vc are
split off). Every FP8 matrix must be e4m3 with row-major fp32 block-128 scales of the
checkpoint's shape; anything else (requantized, transposed or column-major scales) is a
reason, and the build stops naming every one.

``draft_weights`` does the same for the MTP draft: its decoder layer (``model.decoder``,
under the reference's layer id ``num_hidden_layers``: MoE with its own indexer) plus the bf16
``enorm`` / ``hnorm`` / ``eh_proj`` / ``shared_head.norm`` the draft's torch input path reads.

On CUDA upstream merges the indexer's wk (dequantized to bf16) and weights_proj into one
bf16 ``wk_weights_proj``; ``Bf16Rows`` hands its wk rows to the fused layer, which rebuilds
the same merged matrix (the one derived copy the plan counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from sglang.srt.layers.fused_decode.reference.config import Glm5Config
from sglang.srt.layers.fused_decode.reference.quant import FP8, Fp8Weight
from sglang.srt.layers.fused_decode.reference.weights import (
    AttentionWeights,
    DenseMlpWeights,
    IndexerWeights,
    LayerWeights,
    MoeWeights,
    MtpWeights,
)

BLOCK = 128


@dataclass
class Bf16Rows:
    """A bf16 matrix standing where the fused layer expects an FP8 one it only dequantizes."""

    w: torch.Tensor

    @property
    def shape(self):
        return self.w.shape

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.w.to(dtype)


class Reasons(list):
    def need(self, ok: bool, what: str) -> bool:
        if not ok:
            self.append(what)
        return ok


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def fp8(module: Any, name: str, why: Reasons, rows: Optional[Tuple[int, int]] = None,
        expert: Optional[slice] = None, weight: str = "weight",
        scale: str = "weight_scale_inv") -> Optional[Fp8Weight]:
    """An Fp8Weight view of module.<weight> / <scale> (rows: a block-aligned row range)."""
    q, s = getattr(module, weight, None), getattr(module, scale, None)
    if not why.need(q is not None and s is not None, f"{name}: no {weight} / {scale}"):
        return None
    ok = why.need(q.dtype == FP8, f"{name}: weight dtype {q.dtype}, need float8_e4m3fn")
    ok &= why.need(s.dtype == torch.float32 and s.is_contiguous(),
                   f"{name}: scales {s.dtype}, contiguous={s.is_contiguous()}; need row-major fp32")
    ok &= why.need(tuple(s.shape[-2:]) == (_blocks(q.shape[-2]), _blocks(q.shape[-1])),
                   f"{name}: scales {tuple(s.shape)} are not block-128 of {tuple(q.shape)}")
    if not ok:
        return None
    q, s = q.data, s.data
    if expert is not None:
        q, s = q[expert], s[expert]
    if rows is not None:
        a, b = rows
        if not why.need(a % BLOCK == 0 and (b % BLOCK == 0 or b == q.shape[-2]),
                        f"{name}: rows {rows} are not block-aligned"):
            return None
        q, s = q[..., a:b, :], s[..., a // BLOCK:_blocks(b), :]
    return Fp8Weight(q, s, BLOCK)


def _dense_mlp(mlp: Any, name: str, why: Reasons) -> Optional[DenseMlpWeights]:
    inter = mlp.gate_up_proj.weight.shape[0] // 2
    return DenseMlpWeights(
        gate=fp8(mlp.gate_up_proj, f"{name}.gate_up_proj", why, (0, inter)),
        up=fp8(mlp.gate_up_proj, f"{name}.gate_up_proj", why, (inter, 2 * inter)),
        down=fp8(mlp.down_proj, f"{name}.down_proj", why),
    )


def _moe(mlp: Any, cfg: Glm5Config, name: str, why: Reasons) -> Optional[MoeWeights]:
    ex, e = mlp.experts, cfg.n_routed_experts
    inter = ex.w13_weight.shape[1] // 2
    fused_shared = int(getattr(mlp, "num_fused_shared_experts", 0) or 0)
    why.need(ex.w13_weight.shape[0] == e + fused_shared,
             f"{name}.experts: {ex.w13_weight.shape[0]} local experts, need all {e} "
             f"(+{fused_shared} fused shared): expert parallelism is not served")
    routed = slice(0, e)
    gate = fp8(ex, f"{name}.experts.w13", why, (0, inter), routed, "w13_weight",
               "w13_weight_scale_inv")
    up = fp8(ex, f"{name}.experts.w13", why, (inter, 2 * inter), routed, "w13_weight",
             "w13_weight_scale_inv")
    down = fp8(ex, f"{name}.experts.w2", why, None, routed, "w2_weight", "w2_weight_scale_inv")
    if fused_shared:
        why.need(fused_shared == 1, f"{name}: {fused_shared} fused shared experts, need 1")
        shared = DenseMlpWeights(
            gate=fp8(ex, f"{name}.shared(w13)", why, (0, inter), e, "w13_weight",
                     "w13_weight_scale_inv"),
            up=fp8(ex, f"{name}.shared(w13)", why, (inter, 2 * inter), e, "w13_weight",
                   "w13_weight_scale_inv"),
            down=fp8(ex, f"{name}.shared(w2)", why, None, e, "w2_weight", "w2_weight_scale_inv"),
        )
    else:
        shared = _dense_mlp(mlp.shared_experts, f"{name}.shared_experts", why)
    bias = getattr(mlp.gate, "e_score_correction_bias", None)
    why.need(bias is not None and bias.dtype == torch.float32,
             f"{name}.gate: the correction bias must be fp32")
    router = mlp.gate.weight
    why.need(router.dtype == torch.bfloat16, f"{name}.gate: router weight {router.dtype}, need bf16")
    return MoeWeights(router=router.data, bias=None if bias is None else bias.data, gate=gate,
                      up=up, down=down, shared=shared)


def _indexer(ix: Any, cfg: Glm5Config, name: str, why: Reasons) -> Optional[IndexerWeights]:
    if ix is None:
        why.append(f"{name}: an indexer layer without an indexer module")
        return None
    d = cfg.index_head_dim
    merged = getattr(ix, "wk_weights_proj", None)
    if merged is not None:
        w = merged.weight.data
        why.need(w.dtype == torch.bfloat16, f"{name}.wk_weights_proj: {w.dtype}, need bf16")
        wk, weights_proj = Bf16Rows(w[:d]), w[d:]
    else:
        wk, weights_proj = fp8(ix.wk, f"{name}.wk", why), ix.weights_proj.weight.data
    norm = ix.k_norm
    why.need(getattr(norm, "bias", None) is not None, f"{name}.k_norm: LayerNorm with a bias needed")
    return IndexerWeights(wq_b=fp8(ix.wq_b, f"{name}.wq_b", why), wk=wk,
                          weights_proj=weights_proj, k_norm_weight=norm.weight.data,
                          k_norm_bias=None if norm.bias is None else norm.bias.data)


def layer_weights(layer: Any, cfg: Glm5Config, layer_id: int, why: Reasons,
                  name: Optional[str] = None) -> LayerWeights:
    """One decoder layer's weights as views of upstream's loaded parameters."""
    a, name = layer.self_attn, name or f"model.layers.{layer_id}"
    q_lora = cfg.q_lora_rank
    qkv = a.fused_qkv_a_proj_with_mqa
    kv_b = a.kv_b_proj.weight
    why.need(kv_b.dtype == torch.bfloat16, f"{name}.kv_b_proj: {kv_b.dtype}, need bf16")
    attn = AttentionWeights(
        q_a=fp8(qkv, f"{name}.fused_qkv_a_proj_with_mqa", why, (0, q_lora)),
        q_a_norm=a.q_a_layernorm.weight.data,
        kv_a=fp8(qkv, f"{name}.fused_qkv_a_proj_with_mqa", why,
                 (q_lora, q_lora + cfg.kv_cache_dim)),
        kv_a_norm=a.kv_a_layernorm.weight.data,
        q_b=fp8(a.q_b_proj, f"{name}.q_b_proj", why),
        kv_b=kv_b.data,
        o_proj=fp8(a.o_proj, f"{name}.o_proj", why),
        indexer=_indexer(a.indexer, cfg, f"{name}.indexer", why) if cfg.runs_indexer(layer_id)
        else None,
    )
    mlp = (_moe(layer.mlp, cfg, f"{name}.mlp", why) if cfg.is_moe(layer_id)
           else _dense_mlp(layer.mlp, f"{name}.mlp", why))
    return LayerWeights(layer_id, layer.input_layernorm.weight.data,
                        layer.post_attention_layernorm.weight.data, attn, mlp)


def model_weights(model: Any, cfg: Glm5Config) -> Tuple[List[LayerWeights], List[str]]:
    """Every decoder layer of the target model, and every reason the views cannot be made."""
    why = Reasons()
    layers = model.model.layers
    out = [layer_weights(layers[i], cfg, i, why) for i in range(cfg.num_hidden_layers)]
    return out, list(why)


def _bf16(t: Any, name: str, shape: Tuple[int, ...], why: Reasons) -> Optional[torch.Tensor]:
    if not why.need(t is not None, f"{name}: missing"):
        return None
    ok = why.need(t.dtype == torch.bfloat16, f"{name}: {t.dtype}, need bf16")
    ok &= why.need(tuple(t.shape) == shape, f"{name}: shape {tuple(t.shape)}, need {shape}")
    return t.data if ok else None


def draft_weights(model: Any, cfg: Glm5Config) -> Tuple[Optional[MtpWeights], List[str]]:
    """The MTP draft's weights as views of its loaded parameters (its decoder layer under the
    reference's id ``num_hidden_layers``), and every reason the views cannot be made."""
    why = Reasons()
    nm, h = model.model, cfg.hidden_size
    eh = nm.eh_proj
    why.need(getattr(eh, "bias", None) is None, "model.eh_proj: a bias is not served")
    mtp = MtpWeights(
        enorm=_bf16(nm.enorm.weight, "model.enorm", (h,), why),
        hnorm=_bf16(nm.hnorm.weight, "model.hnorm", (h,), why),
        eh_proj=_bf16(getattr(eh, "weight", None), "model.eh_proj", (h, 2 * h), why),
        layer=layer_weights(nm.decoder, cfg, cfg.num_hidden_layers, why, "model.decoder"),
        head_norm=_bf16(nm.shared_head.norm.weight, "model.shared_head.norm", (h,), why),
    )
    return (None if why else mtp), list(why)


def pool_buffers(pool: Any, layer_ids: List[int], cfg: Glm5Config,
                 pool_ids: Optional[Dict[int, int]] = None
                 ) -> Tuple[Dict[int, torch.Tensor], Dict[int, torch.Tensor]]:
    """Upstream's DSA pool buffers per layer: latent KV and (indexer layers) index-K pages,
    keyed by the plan's layer ids. ``pool_ids`` maps a plan id to the pool's layer where they
    differ (the draft's pool holds its one layer at 0)."""
    at = lambda i: (pool_ids or {}).get(i, i)  # noqa: E731
    kv = {i: pool.get_key_buffer(at(i)) for i in layer_ids}
    index = {i: pool.get_index_k_with_scale_buffer(at(i)) for i in layer_ids
             if cfg.runs_indexer(i)}
    return kv, index
