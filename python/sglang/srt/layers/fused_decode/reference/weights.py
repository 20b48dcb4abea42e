"""Random GLM-5.3 weights for one TP rank, as the FP8 block-128 checkpoint holds them.

FP8 e4m3 + fp32 block scales for q_a, kv_a, q_b, o_proj, the indexer's wq_b and wk, the dense
MLP and every expert (shared included); bf16 for kv_b, the router, norms, embedding, LM head
and the indexer's weights_proj; fp32 for the router's correction bias.

Values come from `rng.uniform` (a hash of seed, name and global index), so each tensor is built
directly on the target device, one layer at a time, and a rank's slice at TP t equals the same
rows of the TP1 tensor. Split like SGLang's default TP: q_b / kv_b / o_proj by head, the dense
and expert intermediates, the LM head by vocab; everything else replicated (the embedding is
kept whole: a lookup has no numerics). Scales keep activations near unit RMS through the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .config import Glm5Config, per_rank
from .quant import FP8, FP8_MAX, Fp8Weight
from .rng import uniform

Index = Sequence[Tuple[int, int]]


@dataclass
class IndexerWeights:
    wq_b: Fp8Weight  # [index_n_heads * 128, q_lora]
    wk: Fp8Weight  # [128, hidden]
    weights_proj: torch.Tensor  # bf16 [index_n_heads, hidden]
    k_norm_weight: torch.Tensor  # bf16 [128] (LayerNorm, run in fp32)
    k_norm_bias: torch.Tensor  # bf16 [128]


@dataclass
class AttentionWeights:
    q_a: Fp8Weight  # [q_lora, hidden]
    q_a_norm: torch.Tensor  # bf16 [q_lora]
    kv_a: Fp8Weight  # [kv_lora + rope, hidden]
    kv_a_norm: torch.Tensor  # bf16 [kv_lora]
    q_b: Fp8Weight  # [heads_t * (nope + rope), q_lora]
    kv_b: torch.Tensor  # bf16 [heads_t * (nope + v), kv_lora]
    o_proj: Fp8Weight  # [hidden, heads_t * v]
    indexer: Optional[IndexerWeights]


@dataclass
class DenseMlpWeights:
    gate: Fp8Weight  # [intermediate_t, hidden]
    up: Fp8Weight
    down: Fp8Weight  # [hidden, intermediate_t]


@dataclass
class MoeWeights:
    router: torch.Tensor  # bf16 [n_routed, hidden]
    bias: torch.Tensor  # fp32 [n_routed] (e_score_correction_bias)
    gate: Fp8Weight  # stacked [n_routed, moe_intermediate_t, hidden]
    up: Fp8Weight
    down: Fp8Weight  # stacked [n_routed, hidden, moe_intermediate_t]
    shared: DenseMlpWeights  # intermediate moe_intermediate * n_shared / t


@dataclass
class LayerWeights:
    layer_id: int
    input_norm: torch.Tensor  # bf16 [hidden]
    post_attention_norm: torch.Tensor  # bf16 [hidden]
    attn: AttentionWeights
    mlp: Union[DenseMlpWeights, MoeWeights]

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, MoeWeights)


@dataclass
class MtpWeights:
    """The NextN draft layer: enorm/hnorm, eh_proj (bf16 [hidden, 2 hidden]), a MoE layer with its
    own indexer, shared_head.norm. It shares the target's embedding and LM head."""

    enorm: torch.Tensor
    hnorm: torch.Tensor
    eh_proj: torch.Tensor
    layer: LayerWeights
    head_norm: torch.Tensor


@dataclass
class ModelWeights:
    cfg: Glm5Config
    tp_size: int
    tp_rank: int
    layers: Dict[int, LayerWeights] = field(default_factory=dict)
    embed: Optional[torch.Tensor] = None  # bf16 [vocab, hidden]
    final_norm: Optional[torch.Tensor] = None  # bf16 [hidden]
    lm_head: Optional[torch.Tensor] = None  # bf16 [vocab_t, hidden]
    mtp: Optional[MtpWeights] = None


class WeightGen:
    """Builds named tensors (or one rank's slice of them) from a seed on one device."""

    def __init__(self, cfg: Glm5Config, seed: int, device="cpu"):
        self.cfg, self.seed, self.device = cfg, seed, torch.device(device)

    def u(self, name: str, shape, index: Optional[Index] = None) -> torch.Tensor:
        return uniform(self.seed, name, shape, index, self.device)

    def fp8(self, name: str, shape, index: Optional[Index] = None, gain: float = 1.0) -> Fp8Weight:
        """Block-FP8 matrix (stack) with values of RMS about gain/sqrt(K)."""
        b = self.cfg.block
        index = list(index) if index is not None else [(0, n) for n in shape]
        for (a, e), n in zip(index[-2:], shape[-2:]):
            assert a % b == 0 and (e % b == 0 or e == n), f"{name}: slice {index} not block-aligned"
        q = (self.u(name, shape, index) * FP8_MAX).to(FP8)
        s_shape = [*shape[:-2], -(-shape[-2] // b), -(-shape[-1] // b)]
        s_index = [*index[:-2], *[(a // b, -(-e // b)) for a, e in index[-2:]]]
        amp = (3.0 / shape[-1]) ** 0.5 * gain
        s = (1.0 + 0.25 * self.u(name + ".scale", s_shape, s_index)) * (amp / FP8_MAX)
        return Fp8Weight(q, s, b)

    def dense(self, name: str, shape, index: Optional[Index] = None, gain: float = 1.0,
              dtype=torch.bfloat16) -> torch.Tensor:
        return (self.u(name, shape, index) * ((3.0 / shape[-1]) ** 0.5 * gain)).to(dtype)

    def norm(self, name: str, n: int) -> torch.Tensor:
        return (1.0 + 0.1 * self.u(name, [n])).to(torch.bfloat16)


def _rows(n_full: int, tp_size: int, tp_rank: int) -> Tuple[int, int]:
    per = n_full // tp_size
    return (tp_rank * per, (tp_rank + 1) * per)


def gen_mlp(g: WeightGen, prefix: str, inter: int, tp_size: int, tp_rank: int) -> DenseMlpWeights:
    h = g.cfg.hidden_size
    r = _rows(inter, tp_size, tp_rank)
    return DenseMlpWeights(
        gate=g.fp8(f"{prefix}.gate_proj", [inter, h], [r, (0, h)]),
        up=g.fp8(f"{prefix}.up_proj", [inter, h], [r, (0, h)]),
        down=g.fp8(f"{prefix}.down_proj", [h, inter], [(0, h), r]),
    )


def gen_layer(cfg: Glm5Config, seed: int, layer_id: int, tp_size: int = 1, tp_rank: int = 0,
              device="cpu") -> LayerWeights:
    """One decoder layer's weights for one TP rank (layer_id == num_hidden_layers: the MTP block)."""
    sizes = per_rank(cfg, tp_size)
    g = WeightGen(cfg, seed, device)
    p = f"model.layers.{layer_id}"
    h, nh = cfg.hidden_size, cfg.num_attention_heads
    heads = _rows(nh, tp_size, tp_rank)
    qk, nv = cfg.qk_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim
    indexer = None
    if cfg.runs_indexer(layer_id):
        ni, di = cfg.index_n_heads, cfg.index_head_dim
        indexer = IndexerWeights(
            wq_b=g.fp8(f"{p}.self_attn.indexer.wq_b", [ni * di, cfg.q_lora_rank]),
            wk=g.fp8(f"{p}.self_attn.indexer.wk", [di, h]),
            weights_proj=g.dense(f"{p}.self_attn.indexer.weights_proj", [ni, h]),
            k_norm_weight=g.norm(f"{p}.self_attn.indexer.k_norm.weight", di),
            k_norm_bias=(0.05 * g.u(f"{p}.self_attn.indexer.k_norm.bias", [di])).to(torch.bfloat16),
        )
    attn = AttentionWeights(
        q_a=g.fp8(f"{p}.self_attn.q_a_proj", [cfg.q_lora_rank, h]),
        q_a_norm=g.norm(f"{p}.self_attn.q_a_layernorm.weight", cfg.q_lora_rank),
        kv_a=g.fp8(f"{p}.self_attn.kv_a_proj_with_mqa", [cfg.kv_cache_dim, h]),
        kv_a_norm=g.norm(f"{p}.self_attn.kv_a_layernorm.weight", cfg.kv_lora_rank),
        q_b=g.fp8(f"{p}.self_attn.q_b_proj", [nh * qk, cfg.q_lora_rank],
                  [(heads[0] * qk, heads[1] * qk), (0, cfg.q_lora_rank)]),
        kv_b=g.dense(f"{p}.self_attn.kv_b_proj", [nh * nv, cfg.kv_lora_rank],
                     [(heads[0] * nv, heads[1] * nv), (0, cfg.kv_lora_rank)]),
        o_proj=g.fp8(f"{p}.self_attn.o_proj", [h, nh * cfg.v_head_dim],
                     [(0, h), (heads[0] * cfg.v_head_dim, heads[1] * cfg.v_head_dim)]),
        indexer=indexer,
    )
    if cfg.is_moe(layer_id):
        e, im = cfg.n_routed_experts, cfg.moe_intermediate_size
        r = _rows(im, tp_size, tp_rank)
        mlp = MoeWeights(
            router=g.dense(f"{p}.mlp.gate.weight", [e, h], gain=2.0),
            bias=0.1 * g.u(f"{p}.mlp.gate.e_score_correction_bias", [e]),
            gate=g.fp8(f"{p}.mlp.experts.gate_proj", [e, im, h], [(0, e), r, (0, h)]),
            up=g.fp8(f"{p}.mlp.experts.up_proj", [e, im, h], [(0, e), r, (0, h)]),
            down=g.fp8(f"{p}.mlp.experts.down_proj", [e, h, im], [(0, e), (0, h), r]),
            shared=gen_mlp(g, f"{p}.mlp.shared_experts", im * cfg.n_shared_experts,
                           tp_size, tp_rank),
        )
        assert sizes["moe_intermediate"] == r[1] - r[0]
    else:
        mlp = gen_mlp(g, f"{p}.mlp", cfg.intermediate_size, tp_size, tp_rank)
    return LayerWeights(
        layer_id=layer_id,
        input_norm=g.norm(f"{p}.input_layernorm.weight", h),
        post_attention_norm=g.norm(f"{p}.post_attention_layernorm.weight", h),
        attn=attn,
        mlp=mlp,
    )


def gen_mtp(cfg: Glm5Config, seed: int, tp_size: int = 1, tp_rank: int = 0, device="cpu") -> MtpWeights:
    g = WeightGen(cfg, seed, device)
    lid = cfg.num_hidden_layers
    p = f"model.layers.{lid}"
    h = cfg.hidden_size
    return MtpWeights(
        enorm=g.norm(f"{p}.enorm.weight", h),
        hnorm=g.norm(f"{p}.hnorm.weight", h),
        eh_proj=g.dense(f"{p}.eh_proj.weight", [h, 2 * h]),
        layer=gen_layer(cfg, seed, lid, tp_size, tp_rank, device),
        head_norm=g.norm(f"{p}.shared_head.norm.weight", h),
    )


def generate_weights(
    cfg: Glm5Config,
    seed: int = 0,
    tp_size: int = 1,
    tp_rank: int = 0,
    device="cpu",
    layers: Optional[Iterable[int]] = None,
    embed_and_head: bool = True,
    mtp: bool = False,
) -> ModelWeights:
    """One TP rank's weights, built layer by layer on `device` (nothing staged on the CPU).

    `layers` picks decoder layers (default: all); `embed_and_head` adds the embedding, final norm
    and this rank's LM-head rows; `mtp` adds the NextN layer."""
    cfg.check_tp(tp_size)
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank} outside tp_size={tp_size}")
    w = ModelWeights(cfg, tp_size, tp_rank)
    for i in range(cfg.num_hidden_layers) if layers is None else layers:
        w.layers[i] = gen_layer(cfg, seed, i, tp_size, tp_rank, device)
    if embed_and_head:
        g = WeightGen(cfg, seed, device)
        v, h = cfg.vocab_size, cfg.hidden_size
        w.embed = g.u("model.embed_tokens.weight", [v, h]).to(torch.bfloat16)
        w.final_norm = g.norm("model.norm.weight", h)
        w.lm_head = g.dense("lm_head.weight", [v, h], [_rows(v, tp_size, tp_rank), (0, h)], gain=2.0)
    if mtp:
        w.mtp = gen_mtp(cfg, seed, tp_size, tp_rank, device)
    return w


def tensor_bytes(obj) -> int:
    """Bytes of every tensor reachable from a weights object."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Fp8Weight):
        return tensor_bytes(obj.q) + tensor_bytes(obj.s)
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(tensor_bytes(getattr(obj, f)) for f in obj.__dataclass_fields__ if f != "cfg")
    return 0


def layer_list(w: ModelWeights) -> List[LayerWeights]:
    return [w.layers[i] for i in sorted(w.layers)]
