"""One GLM-5.3 decoder layer of one TP rank on the fused kernels (1-16 rows).

``build_fused_layer`` runs once at load: it keeps the layer's weights in place (kv_b for
w_kc / w_vc, the FP8 matrices and their scales), makes the one derived copy SGLang also makes
(the indexer's [wk; weights_proj] in bf16), and allocates every buffer for ``max_rows``. The
returned callable has the semantics of the reference ``layer_forward`` for one rank (partial
sums, the all-reduce left to the caller), writes the KV and index caches in place, allocates
nothing and never synchronizes with the host, so a step of it can be captured in a CUDA graph.

Launch sequence (stage kernels from ``sgl_kernel_ext.triton``): add+RMSNorm; q_a|kv_a;
latent norms + rope + KV write; q_b (| wq_b); indexer keys/queries, scores, top-k; absorb;
sparse attention + combine; w_vc; o_proj; add+RMSNorm; MLP (router, route, gate/up, down).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from sgl_kernel_ext.triton import bf16_linear, fp8_linear, indexer, mla, moe, norm

from .reference.batch import RowBatch
from .reference.cache import Caches
from .reference.config import Glm5Config
from .reference.weights import LayerWeights, MoeWeights

ROUTER_SPLIT = 8
INDEX_KW_SPLIT = 8


def topk_positions(scores: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """SGLang's top-k semantics on the GPU without a host sync: ascending context positions of
    the k best scores (every position when the context is shorter), -1 padded. scores [M, >= k]
    holds -inf past each context."""
    vals, idx = scores.topk(k, dim=1, sorted=False)
    big = torch.iinfo(torch.int64).max
    idx.masked_fill_(vals == float("-inf"), big)
    idx = idx.sort(dim=1).values
    out.copy_(idx.masked_fill_(idx == big, -1))


def _prefix(buf: torch.Tensor, *shape: int) -> torch.Tensor:
    """A contiguous view of buf's first elements as `shape` (for kernels that index with the
    step's row count)."""
    n = 1
    for d in shape:
        n *= d
    return buf.view(-1)[:n].view(*shape)


@dataclass
class _Buffers:
    x: torch.Tensor
    residual: torch.Tensor
    qa: torch.Tensor
    kva: torch.Tensor
    cq: torch.Tensor
    q: torch.Tensor
    qcat: torch.Tensor
    part_o: torch.Tensor
    part_ml: torch.Tensor
    olat: torch.Tensor
    o: torch.Tensor
    y_attn: torch.Tensor
    x2: torch.Tensor
    y: torch.Tensor
    topk: torch.Tensor
    act: torch.Tensor
    slot_expert: torch.Tensor
    slot_weight: torch.Tensor
    num_slots: torch.Tensor
    router_parts: Optional[torch.Tensor] = None
    q_index: Optional[torch.Tensor] = None
    kw_parts: Optional[torch.Tensor] = None
    q8: Optional[torch.Tensor] = None
    head_w: Optional[torch.Tensor] = None
    scores: Optional[torch.Tensor] = None


class FusedLayer:
    def __init__(self, cfg: Glm5Config, lw: LayerWeights, caches: Caches, max_rows: int,
                 max_context: Optional[int] = None):
        self.cfg, self.lw, self.max_rows = cfg, lw, max_rows
        a = lw.attn
        dev = a.q_a.q.device
        self.kv_cache = caches.kv[lw.layer_id]
        self.index_cache = caches.index.get(lw.layer_id)
        self.runs_indexer = cfg.runs_indexer(lw.layer_id)
        rope = cfg.qk_rope_head_dim
        self.inv_freq = 1.0 / (cfg.rope_theta ** (
            torch.arange(0, rope, 2, dtype=torch.float32, device=dev) / rope))
        self.heads = a.q_b.q.shape[0] // cfg.qk_head_dim
        m, h, c = max_rows, cfg.hidden_size, cfg.kv_lora_rank
        self.splits = mla.attention_splits(max_rows, cfg.index_topk)
        if self.runs_indexer:
            ix = a.indexer
            self.wk_proj = torch.cat(
                [ix.wk.dequant(torch.float32).to(torch.bfloat16), ix.weights_proj.to(torch.bfloat16)]
            ).contiguous()
        mlp = lw.mlp
        if isinstance(mlp, MoeWeights):
            self.experts = mlp.router.shape[0]
            inter = mlp.shared.gate.q.shape[0]
            slots = m * cfg.num_experts_per_tok + 1
        else:
            self.experts = 0
            inter = mlp.gate.q.shape[0]
            slots = 1
        f32, bf16 = torch.float32, torch.bfloat16
        e = lambda *s, dt=bf16: torch.empty(*s, dtype=dt, device=dev)  # noqa: E731
        b = _Buffers(
            x=e(m, h), residual=e(m, h), qa=e(m, cfg.q_lora_rank), kva=e(m, c + rope),
            cq=e(m, cfg.q_lora_rank), q=e(m, self.heads, cfg.qk_head_dim),
            qcat=e(m, self.heads, c + rope), part_o=e(m, self.splits, self.heads, c, dt=f32),
            part_ml=e(m, self.splits, self.heads, 2, dt=f32), olat=e(m, self.heads, c),
            o=e(m, self.heads * cfg.v_head_dim), y_attn=e(m, h), x2=e(m, h), y=e(m, h),
            topk=e(m, cfg.index_topk, dt=torch.int64), act=e(slots, m, inter),
            slot_expert=e(slots, dt=torch.int32), slot_weight=e(slots, m, dt=f32),
            num_slots=e(1, dt=torch.int32),
        )
        if self.experts:
            b.router_parts = e(ROUTER_SPLIT, m, self.experts, dt=f32)
        else:  # the dense MLP is the single shared slot
            b.slot_expert.fill_(0)
            b.slot_weight.fill_(1.0)
            b.num_slots.fill_(1)
        if self.runs_indexer:
            ni, di = cfg.index_n_heads, cfg.index_head_dim
            b.q_index = e(m, ni, di)
            b.kw_parts = e(INDEX_KW_SPLIT, m, di + ni, dt=f32)
            b.q8 = e(m, ni, di, dt=torch.float8_e4m3fn)
            b.head_w = e(m, ni, dt=f32)
            width = max(max_context or cfg.max_position_embeddings, cfg.index_topk)
            b.scores = e(m, width, dt=f32)
        self.buf = b

    def __call__(self, hidden: torch.Tensor, residual: Optional[torch.Tensor], batch: RowBatch,
                 topk_prev: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, lw, a, b = self.cfg, self.lw, self.lw.attn, self.buf
        m = batch.num_rows
        if not 1 <= m <= self.max_rows:
            raise ValueError(f"{m} rows; this layer was built for 1..{self.max_rows}")
        pos, slots = batch.positions, batch.token_slots
        eps, c, rope = cfg.rms_norm_eps, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        x, res = b.x[:m], b.residual[:m]
        norm.add_rms_norm(hidden, residual, lw.input_norm, eps, x, res)
        qa, kva, cq = b.qa[:m], b.kva[:m], b.cq[:m]
        fp8_linear.fp8_linear(x, a.q_a.q, a.q_a.s, qa, a.kv_a.q, a.kv_a.s, kva)
        mla.latent(qa, kva, a.q_a_norm, a.kv_a_norm, eps, pos, slots, self.inv_freq, cq,
                   self.kv_cache, c, rope)
        q = b.q[:m]
        if self.runs_indexer:
            ix = a.indexer
            qi = b.q_index[:m]
            fp8_linear.fp8_linear(cq, a.q_b.q, a.q_b.s, q.view(m, -1), ix.wq_b.q, ix.wq_b.s,
                                  qi.view(m, -1))
            kw_parts = _prefix(b.kw_parts, INDEX_KW_SPLIT, m, b.kw_parts.shape[2])
            bf16_linear.bf16_linear_splitk(x, self.wk_proj, kw_parts)
            indexer.prepare(kw_parts, qi, ix.k_norm_weight, ix.k_norm_bias, cfg.index_k_norm_eps,
                            pos, slots, self.inv_freq, self.index_cache, b.q8[:m], b.head_w[:m],
                            rope)
            width = max(slots.shape[1], cfg.index_topk)
            if width > b.scores.shape[1]:
                raise ValueError(f"context width {width} > the {b.scores.shape[1]} built for")
            scores = b.scores[:m, :width]
            indexer.scores(b.q8[:m], b.head_w[:m], self.index_cache, pos, slots, scores)
            topk = b.topk[:m]
            topk_positions(scores, cfg.index_topk, topk)
        else:
            if topk_prev is None:
                raise ValueError(f"layer {lw.layer_id} reuses the previous top-k but none was given")
            fp8_linear.fp8_linear(cq, a.q_b.q, a.q_b.s, q.view(m, -1))
            topk = topk_prev
        qcat = b.qcat[:m]
        mla.absorb(q, a.kv_b, pos, self.inv_freq, qcat, cfg.qk_nope_head_dim, rope,
                   cfg.v_head_dim)
        mla.sparse_attention(qcat, self.kv_cache, topk, slots, cfg.softmax_scale,
                             b.part_o[:m], b.part_ml[:m], b.olat[:m], c, rope)
        mla.absorb_v(b.olat[:m], a.kv_b, b.o[:m], cfg.qk_nope_head_dim, cfg.v_head_dim)
        y_attn = b.y_attn[:m]
        fp8_linear.fp8_linear(b.o[:m], a.o_proj.q, a.o_proj.s, y_attn)
        x2 = b.x2[:m]
        norm.add_rms_norm(y_attn, res, lw.post_attention_norm, eps, x2, res)
        self._mlp(x2, pos, m)
        return b.y[:m], res, topk

    def routed_experts(self, m: int) -> torch.Tensor:
        """Experts each row of the last step was routed to, int64 [m, top-k] ascending (-1 for
        a pad row). Reads the slot table back to the host: for tests and check mode only."""
        b, k = self.buf, self.cfg.num_experts_per_tok
        n = int(b.num_slots)
        experts = b.slot_expert[1:n].long().cpu()
        weights = _prefix(b.slot_weight, b.slot_weight.shape[0], m)[1:n].cpu()
        out = torch.full((m, k), -1, dtype=torch.int64)
        for r in range(m):
            chosen = experts[weights[:, r] > 0].sort().values
            out[r, : len(chosen)] = chosen
        return out

    def _mlp(self, x2: torch.Tensor, pos: torch.Tensor, m: int) -> None:
        cfg, mlp, b = self.cfg, self.lw.mlp, self.buf
        slots, _, inter = b.act.shape
        act = _prefix(b.act, slots, m, inter)
        slot_weight = _prefix(b.slot_weight, slots, m)
        y = b.y[:m]
        if self.experts:
            parts = _prefix(b.router_parts, ROUTER_SPLIT, m, self.experts)
            bf16_linear.bf16_linear_splitk(x2, mlp.router, parts)
            moe.route(parts, mlp.bias, pos, cfg.num_experts_per_tok, cfg.routed_scaling_factor,
                      cfg.norm_topk_prob, b.slot_expert, slot_weight, b.num_slots)
            sh = mlp.shared
            moe.gate_up(x2, self.experts, b.slot_expert, b.num_slots, mlp.gate.q, mlp.gate.s,
                        mlp.up.q, mlp.up.s, sh.gate.q, sh.gate.s, sh.up.q, sh.up.s, act)
            moe.down(act, self.experts, b.slot_expert, slot_weight, b.num_slots, mlp.down.q,
                     mlp.down.s, sh.down.q, sh.down.s, y)
        else:
            moe.gate_up(x2, 0, b.slot_expert, b.num_slots, mlp.gate.q, mlp.gate.s, mlp.up.q,
                        mlp.up.s, mlp.gate.q, mlp.gate.s, mlp.up.q, mlp.up.s, act)
            moe.down(act, 0, b.slot_expert, slot_weight, b.num_slots, mlp.down.q, mlp.down.s,
                     mlp.down.q, mlp.down.s, y)


def build_fused_layer(cfg: Glm5Config, lw: LayerWeights, caches: Caches, max_rows: int,
                      max_context: Optional[int] = None) -> FusedLayer:
    """Build one rank's fused layer for steps of 1..max_rows rows (see the module docstring)."""
    return FusedLayer(cfg, lw, caches, max_rows, max_context)
