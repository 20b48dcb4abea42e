"""HBM bytes and floor time of a GLM-5.3 decode layer and step for one TP rank.

Same model as docs/glm5_arch_spec.md section 3 (and `glm5_arch_bytes.py` in the shared tools):
every weight byte a rank holds and the step touches is read once; FP8 block-128 weights carry
one fp32 scale per 128x128 block; routed experts are read once per distinct expert the M rows
pick (expected E[D] = N (1 - (1 - k/N)^M) under uniform routing, or the count a run really
touched); the latent KV (min(L, index_topk) rows) and the index cache (ceil(L/64) pages of
64 x 132 B, 'full' layers only) are read once per row and are not divided by TP.
Activations, cache writes of the new token, indexer logits and all-reduces are not counted.

floor_us = bytes / bandwidth, with the bandwidth measured in the same run (`harness`).
Pure arithmetic: imports nothing but the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

LAYER_KINDS = ("dense", "moe_idx", "moe")  # dense+indexer, MoE+indexer, MoE reusing the top-k
KV_TOKEN_BYTES = {"bf16": (512 + 64) * 2, "fp8": 512 + 512 // 128 * 4 + 64 * 2}
INDEX_TOKEN_BYTES = 128 + 4
INDEX_PAGE = 64


def fp8_block_bytes(rows: int, cols: int, block: int = 128) -> int:
    """e4m3 values plus one fp32 scale per (partial) block."""
    return rows * cols + math.ceil(rows / block) * math.ceil(cols / block) * 4


def distinct_experts(n_experts: int, k: int, m: int) -> float:
    """Expected number of distinct experts M rows touch, each picking k of n uniformly."""
    return n_experts * (1.0 - (1.0 - k / n_experts) ** m)


@dataclass(frozen=True)
class Geometry:
    """The GLM-5.3 sizes the byte count needs (defaults: the real model)."""

    hidden: int = 6144
    vocab: int = 154880
    layers: int = 78
    heads: int = 64
    q_lora: int = 2048
    kv_lora: int = 512
    nope: int = 192
    rope: int = 64
    v_dim: int = 256
    index_heads: int = 32
    index_dim: int = 128
    index_topk: int = 2048
    intermediate: int = 12288
    moe_intermediate: int = 2048
    n_experts: int = 256
    top_k: int = 8
    n_dense: int = 3
    n_moe_idx: int = 18  # MoE layers running their own indexer (plus the 3 dense ones)

    @classmethod
    def from_config(cls, cfg) -> "Geometry":
        """From the reference `Glm5Config` (any object with its field names)."""
        n_dense = sum(1 for i in range(cfg.num_hidden_layers) if not cfg.is_moe(i))
        n_moe_idx = sum(
            1 for i in range(cfg.num_hidden_layers) if cfg.is_moe(i) and cfg.runs_indexer(i)
        )
        return cls(
            hidden=cfg.hidden_size, vocab=cfg.vocab_size, layers=cfg.num_hidden_layers,
            heads=cfg.num_attention_heads, q_lora=cfg.q_lora_rank, kv_lora=cfg.kv_lora_rank,
            nope=cfg.qk_nope_head_dim, rope=cfg.qk_rope_head_dim, v_dim=cfg.v_head_dim,
            index_heads=cfg.index_n_heads, index_dim=cfg.index_head_dim,
            index_topk=cfg.index_topk, intermediate=cfg.intermediate_size,
            moe_intermediate=cfg.moe_intermediate_size, n_experts=cfg.n_routed_experts,
            top_k=cfg.num_experts_per_tok, n_dense=n_dense, n_moe_idx=n_moe_idx,
        )

    @property
    def n_moe_shared(self) -> int:
        return self.layers - self.n_dense - self.n_moe_idx

    # ---- weight bytes of one layer's parts (whole model; per rank = /tp for split parts)
    @property
    def attn_replicated(self) -> int:
        """Fused q_a + kv_a (FP8), the two latent norms and the two layer norms (bf16)."""
        h = self.hidden
        return (fp8_block_bytes(self.q_lora + self.kv_lora + self.rope, h)
                + 2 * (self.q_lora + self.kv_lora) + 2 * 2 * h)

    @property
    def attn_split(self) -> int:
        """q_b (FP8) + kv_b (bf16 w_kc / w_vc) + o_proj (FP8), all heads."""
        qk = self.nope + self.rope
        return (fp8_block_bytes(self.heads * qk, self.q_lora)
                + self.heads * (self.nope + self.v_dim) * self.kv_lora * 2
                + fp8_block_bytes(self.hidden, self.heads * self.v_dim))

    @property
    def indexer(self) -> int:
        """wq_b (FP8) + merged wk / weights_proj (bf16) + k_norm weight and bias (fp32)."""
        d = self.index_dim
        return (fp8_block_bytes(self.index_heads * d, self.q_lora)
                + (d + self.index_heads) * self.hidden * 2 + 2 * d * 4)

    @property
    def dense_mlp(self) -> int:
        return (fp8_block_bytes(2 * self.intermediate, self.hidden)
                + fp8_block_bytes(self.hidden, self.intermediate))

    @property
    def router(self) -> int:
        return self.n_experts * self.hidden * 2 + self.n_experts * 4

    @property
    def expert(self) -> int:
        """One expert (the shared one has the same shape): gate/up + down, FP8."""
        return (fp8_block_bytes(2 * self.moe_intermediate, self.hidden)
                + fp8_block_bytes(self.hidden, self.moe_intermediate))

    @property
    def lm_head(self) -> int:
        """bf16 LM head plus the final norm."""
        return self.vocab * self.hidden * 2 + self.hidden * 2

    # ---- caches
    def kv_rows(self, ctx: int) -> int:
        return min(ctx, self.index_topk)

    def index_cache_bytes(self, ctx: int) -> int:
        return math.ceil(ctx / INDEX_PAGE) * INDEX_PAGE * INDEX_TOKEN_BYTES


GLM53 = Geometry()


def layer_bytes_parts(kind: str, tp: int, m: int, ctx: int, kv_dtype: str = "bf16",
                      geom: Geometry = GLM53, experts: Optional[float] = None) -> Dict[str, float]:
    """Bytes one TP rank must read for one layer of `kind`, by part.

    `experts`: distinct routed experts touched (default: the uniform-routing expectation)."""
    if kind not in LAYER_KINDS:
        raise ValueError(f"layer kind {kind!r}: choose one of {LAYER_KINDS}")
    if kv_dtype not in KV_TOKEN_BYTES:
        raise ValueError(f"kv dtype {kv_dtype!r}: choose one of {tuple(KV_TOKEN_BYTES)}")
    g = geom
    parts = {
        "attn_weights": g.attn_replicated + g.attn_split / tp,
        "kv_cache": m * g.kv_rows(ctx) * KV_TOKEN_BYTES[kv_dtype],
    }
    if kind in ("dense", "moe_idx"):
        parts["indexer_weights"] = g.indexer
        parts["index_cache"] = m * g.index_cache_bytes(ctx)
    if kind == "dense":
        parts["dense_mlp"] = g.dense_mlp / tp
    else:
        d = distinct_experts(g.n_experts, g.top_k, m) if experts is None else experts
        parts["router"] = g.router
        parts["shared_expert"] = g.expert / tp
        parts["routed_experts"] = d * g.expert / tp
    return parts


def layer_bytes(kind: str, tp: int, m: int, ctx: int, kv_dtype: str = "bf16",
                geom: Geometry = GLM53, experts: Optional[float] = None) -> float:
    return sum(layer_bytes_parts(kind, tp, m, ctx, kv_dtype, geom, experts).values())


def step_bytes(tp: int, m: int, ctx: int, kv_dtype: str = "bf16", geom: Geometry = GLM53) -> float:
    """One whole decode step of one rank: every layer, final norm and the rank's LM-head rows."""
    g = geom
    return (g.n_dense * layer_bytes("dense", tp, m, ctx, kv_dtype, g)
            + g.n_moe_idx * layer_bytes("moe_idx", tp, m, ctx, kv_dtype, g)
            + g.n_moe_shared * layer_bytes("moe", tp, m, ctx, kv_dtype, g)
            + g.lm_head / tp)


def floor_us(nbytes: float, bandwidth_bytes_per_s: float) -> float:
    return nbytes / bandwidth_bytes_per_s * 1e6


def lm_head_bytes(tp: int, geom: Geometry = GLM53) -> float:
    return geom.lm_head / tp
