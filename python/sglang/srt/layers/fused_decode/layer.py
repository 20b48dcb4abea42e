"""One GLM-5.3 decoder layer of one TP rank on the fused kernels (1-16 rows).

``build_fused_layer`` runs once at load: it keeps the layer's weights in place (kv_b for
w_kc / w_vc, the FP8 matrices and their scales), makes the one derived copy SGLang also makes
(the indexer's [wk; weights_proj] in bf16), and allocates every buffer for ``max_rows``. The
returned callable has the semantics of the reference ``layer_forward`` for one rank (partial
sums, the all-reduce left to the caller), writes the KV and index caches in place, allocates
nothing and never synchronizes with the host, so a step of it can be captured in a CUDA graph.

A step is the stage kernels below, one launch each, overlapped (``overlap``); with
``persistent_launch=True`` (or SGL_KERNEL_EXT_PERSISTENT=1) it is one launch of the persistent
layer kernel (``persistent_step``), which runs the same task bodies in one resident grid.

Launch sequence (stage kernels from ``sgl_kernel_ext.triton``): add+RMSNorm (+ e4m3 of the
row); q_a|kv_a (split-K partials); latent norms + rope + KV write (+ e4m3 of c_q); q_b
(| wq_b) (on Hopper with CuTe DSL, at 1..sm90.ATTN_SIDE_MAX_ROWS rows of a layer without the
indexer, these three are attn_side's one launch, its K chunks summed as 64-bit integers in
any order); indexer keys/queries, scores, top-k; absorb; sparse attention + combine; w_vc
(+ e4m3); o_proj (on a TP shard its last-arriving K chunks sum each column tile into bf16
rows, which the TP group's all-reduce, ``reduce``, sums across ranks); add+RMSNorm; MLP
(the router's GEMV, then up to 4 rows gate/up routing every row itself, ``moe.Routing``, and
from 5 rows route's launch; at 1-2 rows gate/up's SwiGLU runs as the last-arriving K chunk's
tail, ``arrival``; down, each row's terms summed). Activations are quantized once by the kernel
that produces them; every GEMM's split-K partials are summed in a fixed order by their
consumer, so a step is deterministic. The step buffers may be shared with the model's other
layers (``workspace``).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch

from sgl_kernel_ext.nvidia import sm90
from sgl_kernel_ext.triton import arrival, attn_out, bf16_linear, fp8_linear, indexer, mla, moe
from sgl_kernel_ext.triton import norm, norm_router, overlap, persistent
from sgl_kernel_ext.triton import topk as topk_kernel

from . import persistent_step
from . import workspace as workspace_mod
from .peer_reduce import fuses_norm
from .reference.batch import RowBatch
from .reference.cache import Caches
from .reference.config import Glm5Config
from .reference.weights import LayerWeights, MoeWeights

logger = logging.getLogger(__name__)

ROUTER_SPLIT = 8
INDEX_KW_SPLIT = 8
VC_SPLIT_MAX = 8  # the most latent chunks absorb_v's partials buffer holds (mla.ABSORB_V_SPLIT_C)
Reduce = Callable[[torch.Tensor], torch.Tensor]  # the TP group's all-reduce
# buffers whose rows are the second dimension (split-K partials, [slot, row] tables)
_ROWS_SECOND = {"qa", "kva", "q", "q_index", "kw_parts", "y_attn", "vo_parts",
                "router_parts"}


@functools.lru_cache(maxsize=None)
def _log_once(message: str) -> None:
    """A layer choice's reason, logged once a process (a model builds every layer alike)."""
    logger.info(message)


def _prefix(buf: torch.Tensor, *shape: int) -> torch.Tensor:
    """A contiguous view of buf's first elements as `shape` (for kernels that index with the
    step's row count)."""
    n = 1
    for d in shape:
        n *= d
    return buf.view(-1)[:n].view(*shape)


class FusedLayer:
    def __init__(self, cfg: Glm5Config, lw: LayerWeights, caches: Caches, max_rows: int,
                 max_context: Optional[int] = None, persistent_launch: Optional[bool] = None,
                 workspace: Optional["workspace_mod.Workspace"] = None):
        self.cfg, self.lw, self.max_rows = cfg, lw, max_rows
        # one launch per step (persistent.py) only with SGL_KERNEL_EXT_PERSISTENT=1
        self.persistent = persistent.enabled() if persistent_launch is None else persistent_launch
        a = lw.attn
        dev = a.q_a.q.device
        self.runs_indexer = cfg.runs_indexer(lw.layer_id)
        self.bind_caches(caches)
        rope, c, h = cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.hidden_size
        self.inv_freq = 1.0 / (cfg.rope_theta ** (
            torch.arange(0, rope, 2, dtype=torch.float32, device=dev) / rope))
        self.heads = a.q_b.q.shape[0] // cfg.qk_head_dim
        # a TP shard's o_proj output is its part of a sum over the TP group: the group's
        # all-reduce must come before the post-attention norm (the reference's reduce #1)
        self.sharded = self.heads < cfg.num_attention_heads
        # top-k chunks per row are chosen per step (fewer rows, more chunks): the partials
        # buffers hold the most any width needs
        attn_cap = max(r * mla.attention_splits(r, cfg.index_topk) for r in range(1, max_rows + 1))
        q_b_rows = a.q_b.q.shape[0]
        if self.runs_indexer:
            ix = a.indexer
            # SGLang's merged [wk; weights_proj] bf16 GEMM (the one derived copy)
            self.wk_proj = torch.cat(
                [ix.wk.dequant(torch.float32).to(torch.bfloat16), ix.weights_proj.to(torch.bfloat16)]
            ).contiguous()
            q_b_rows += ix.wq_b.q.shape[0]
        # (block_n, groups, split) of each FP8 GEMM; the split sizes the partials buffers
        self.tile_qkv_a = fp8_linear.tiling(cfg.q_lora_rank + c + rope, h)
        self.tile_q_b = fp8_linear.tiling(q_b_rows, cfg.q_lora_rank)
        self.tile_o = fp8_linear.tiling(h, self.heads * cfg.v_head_dim)
        self.split_qkv_a, self.split_q_b, self.split_o = (
            self.tile_qkv_a[2], self.tile_q_b[2], self.tile_o[2])
        # o_proj and q_a|kv_a on Hopper's CuTe DSL linear (opt-in, sgl_kernel_ext.nvidia.sm90):
        # its K chunks, and x read as whole 8- or 16-row tiles
        self.sm90_o, self.sm90_qkv = sm90.o_proj_enabled(), sm90.qkv_a_enabled()
        if self.sm90_o and attn_out.MAX_ROWS:
            _log_once(f"absorb_v and o_proj run as two launches: {sm90.O_PROJ_ENV}=1 puts "
                      "o_proj on fp8_mma, which attn_out's one launch does not use")
        self.sm90_moe = sm90.moe_enabled()
        self.sm90 = self._sm90_linear(dev)
        self.sm90_attn = self._sm90_attention(dev)
        self.sm90_topk = self._sm90_topk(dev)
        # q_a|kv_a + latent + q_b as one attn_side launch at its rows (sm90.ATTN_SIDE)
        self.attn_side, self.attn_side_work = self._sm90_attn_side(dev)
        o_rows = x_rows = max_rows
        q_b_split = self.split_q_b
        if self.attn_side_work:
            x_rows = max(x_rows, self.attn_side.x_rows(max(self.attn_side_work)))
            q_b_split = max(q_b_split, max(w.split2 for w in self.attn_side_work.values()))
        if self.sm90_o:
            self.split_o = self.sm90.split_for(h, self.heads * cfg.v_head_dim)
            o_rows = max(max_rows, self.sm90.x_rows(max_rows))
        if self.sm90_qkv:
            self.split_qkv_a = self.sm90.split_for(cfg.q_lora_rank + c + rope, h)
            x_rows = max(max_rows, self.sm90.x_rows(max_rows))
        mlp = lw.mlp
        # the weights of the layer's later dense stages, for the first kernel to prefetch into
        # L2 while the latency-bound stages run (with overlap.LAYER_PREFETCH)
        later = [a.q_a.q, a.kv_a.q, a.q_b.q, a.kv_b, a.o_proj.q]
        if self.runs_indexer:
            later += [a.indexer.wq_b.q, self.wk_proj]
        if isinstance(mlp, MoeWeights):
            later += [mlp.router, mlp.shared.gate.q, mlp.shared.up.q, mlp.shared.down.q]
        self.prefetch_regions = overlap.region_table(later, dev)
        self.next_regions: Optional[torch.Tensor] = None  # the next layer's (chain_prefetch)
        if isinstance(mlp, MoeWeights):
            self.experts = mlp.router.shape[0]
            inter = mlp.shared.gate.q.shape[0]
            slots = max_rows * cfg.num_experts_per_tok + 1
        else:
            self.experts, inter, slots = 0, mlp.gate.q.shape[0], 1
        # a MoE layer's experts on Hopper's CuTe DSL kernels (opt-in; a dense MLP keeps Triton's)
        self.fp8_moe = None
        x2_rows = max_rows
        if self.sm90_moe and self.experts:
            from sgl_kernel_ext.nvidia.sm90 import fp8_moe
            self.fp8_moe = fp8_moe
            x2_rows = max(max_rows, self.sm90.x_rows(max_rows))
        m = max_rows
        f32, bf16, fp8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
        e = lambda *s, dt=bf16: workspace_mod.Spec(s, dt)  # noqa: E731
        groups = lambda n: -(-n // 128)  # noqa: E731
        specs = dict(
            xq=e(x_rows, h, dt=fp8), xs=e(m, groups(h), dt=f32), residual=e(m, h),
            qa=e(self.split_qkv_a, m, cfg.q_lora_rank, dt=f32),
            kva=e(self.split_qkv_a, m, c + rope, dt=f32),
            cq_q=e(m, cfg.q_lora_rank, dt=fp8), cq_s=e(m, groups(cfg.q_lora_rank), dt=f32),
            # q_a|kv_a summed by its tails, for q_b's normed x (mla.LATENT_IN_Q_B_MAX_ROWS)
            rows_q=e(m, cfg.q_lora_rank), rows_kv=e(m, c + rope),
            ss_q=e(m, self._tails(cfg.q_lora_rank), dt=f32),
            ss_kv=e(m, self._tails(c + rope), dt=f32),
            q=e(q_b_split, m, a.q_b.q.shape[0], dt=f32),
            # q summed by q_b's tails, for absorb (mla.ABSORB_Q_ROWS_FROM)
            q_rows=e(m, a.q_b.q.shape[0]),
            qcat=e(m, self.heads, c + rope),
            part_o=e(attn_cap, self.heads, c, dt=f32),
            part_ml=e(attn_cap, self.heads, 2, dt=f32), olat=e(m, self.heads, c),
            oq=e(o_rows, self.heads * cfg.v_head_dim, dt=fp8),
            os=e(m, groups(self.heads * cfg.v_head_dim), dt=f32),
            y_attn=e(self.split_o, m, h, dt=f32),
            # a shard's o_proj summed by its tails, the all-reduce's input
            attn_rows=e(m, h), x2=e(m, h), x2q=e(x2_rows, h, dt=fp8),
            x2s=e(m, groups(h), dt=f32), y=e(m, h),
            terms=e(m, cfg.num_experts_per_tok + 1 if self.experts else 1, h),
            topk=e(m, cfg.index_topk, dt=torch.int64), act=e(slots, m, inter),
            # absorb_v's latent-chunk partials (mla.ABSORB_V_SPLIT_C), flat: [S, rows, heads * v]
            vc_parts=e(VC_SPLIT_MAX * m * self.heads * cfg.v_head_dim, dt=f32),
        )
        # the layer's own buffers: the slot table (preset once for a dense layer) and counters
        own = dict(
            slot_expert=e(slots, dt=torch.int32), slot_weight=e(slots, m, dt=f32),
            slot_rank=e(slots, m, dt=torch.int32), num_slots=e(1, dt=torch.int32),
        )
        self.buf = workspace_mod.allocate(own, dev)
        self.buf["counters"] = torch.zeros(persistent.COUNTERS, dtype=torch.int32, device=dev)
        # gate/up's split-K partials: for the most rows that split K (moe.gate_up_tiling), in
        # either form
        dense = not self.experts
        split_rows = [r for r in range(1, m + 1) if moe.gate_up_tiling(r, dense)[2] > 1] or [1]
        split_k = max(moe.gate_up_tiling(r, dense)[2] for r in split_rows)
        split_k = max(split_k, moe.GATE_UP_GEMV_TILING[2])
        few = max(split_rows)
        # last-arrival counters (arrival.py): gate/up's (tile, slot) groups for any tile width
        # down to the MMA's 16 columns (benchmark/tiling_probe.py varies it), the router's one
        self.buf["gu_arrivals"] = arrival.counters(-(-inter // 16) * slots, dev)
        self.buf["route_arrival"] = arrival.counters(1, dev)
        # down's per-slot waits (moe.DOWN_SLOT_WAIT_FROM_ROWS): a counter a slot, then the
        # failure word a wait that gave up sets
        self.buf["down_ready"] = arrival.counters(slots + 1, dev)
        self.buf["qkv_arrivals"] = arrival.counters(
            self._tails(cfg.q_lora_rank) + self._tails(c + rope), dev)
        self.buf["q_arrivals"] = arrival.counters(-(-a.q_b.q.shape[0] // self.tile_q_b[0]), dev)
        # q_b's fixed-point sums for absorb (mla.Q_FIXED_FROM_ROWS), left at zero by absorb_v
        specs["q_sums"] = workspace_mod.Spec((m, a.q_b.q.shape[0]), torch.int64, zeroed=True)
        self.buf["o_arrivals"] = arrival.counters(-(-h // self.tile_o[0]), dev)
        self.buf["vc_arrivals"] = arrival.counters(self.heads * (cfg.v_head_dim // 128), dev)
        # the residual's twin, where attn_side takes the input norm (_residual_apart)
        if self.attn_side_work and sm90.ATTN_SIDE_NORM_IN_MAX_ROWS > 0:
            specs["residual_b"] = e(m, h)
        # absorb_v and o_proj as one launch (attn_out.MAX_ROWS): the heads' partials of y, the
        # absorbed values' int64 sums and their counters (both left at zero)
        specs["vo_parts"] = e(self.heads, m, h, dt=f32)
        specs["vo_sums"] = workspace_mod.Spec((m * self.heads * cfg.v_head_dim,), torch.int64,
                                              zeroed=True)
        self.buf["vo_counts"] = arrival.counters(2 * self.heads + 1, dev)
        specs["gu_parts"] = e(split_k, few * cfg.num_experts_per_tok + 1 if self.experts else 1,
                              few, 2, inter, dt=f32)
        if self.fp8_moe is not None:  # flat: viewed at each step's shapes (_moe_sm90_views)
            units = torch.cuda.get_device_properties(dev).multi_processor_count * \
                self.fp8_moe.GROUPS
            specs["moe_act_q"] = e(slots * x2_rows * inter, dt=fp8)
            specs["moe_act_s"] = e(slots * m * groups(inter), dt=f32)
            specs["moe_parts"] = e(max(self.fp8_moe.gate_up_parts_rows(self._slots(r), inter, h,
                                                                      units) * r
                                       for r in range(1, m + 1)) * 2 * inter, dt=f32)
            self.buf["moe_arrivals"] = arrival.counters(slots * groups(inter), dev)
            self.buf["moe_flags"] = arrival.counters(self.fp8_moe.flags_size(slots, inter), dev)
        if self.experts:
            specs["router_parts"] = e(ROUTER_SPLIT, m, self.experts, dt=f32)
            # norm_router's partials and its K chunks' sums of squares of the un-normed row
            # (norm_router.ROWS; viewed with the step's split, ``norm_router.launch``)
            specs["nr_parts"] = e(norm_router.MAX_SPLIT * m * self.experts, dt=f32)
            specs["nr_ss"] = e(norm_router.MAX_SPLIT * m, dt=f32)
            # ... or its products' int64 sums (norm_router.fixed), left at zero by route
            specs["nr_sums"] = workspace_mod.Spec((m * self.experts,), torch.int64, zeroed=True)
            # each row's choice, for route's one-program-per-row form
            specs["route_chosen"] = e(m * self.experts, dt=torch.int32)
            specs["route_weight"] = e(m * self.experts, dt=f32)
        else:  # the dense MLP is the single shared slot
            self.buf["slot_expert"].fill_(0)
            self.buf["slot_weight"].fill_(1.0)
            self.buf["slot_rank"].fill_(0)
            self.buf["num_slots"].fill_(1)
        if self.runs_indexer:
            ni, di = cfg.index_n_heads, cfg.index_head_dim
            specs["q_index"] = e(self.split_q_b, m, ni * di, dt=f32)
            specs["kw_parts"] = e(INDEX_KW_SPLIT, m, di + ni, dt=f32)
            specs["x"] = e(m, h)
            specs["q8"] = e(m, ni, di, dt=fp8)
            specs["head_w"] = e(m, ni, dt=f32)
            width = max(max_context or cfg.max_position_embeddings, cfg.index_topk)
            specs["scores"] = e(m, width, dt=f32)
            if width > cfg.index_topk:  # scratch of the split top-k (tens of KB)
                p = topk_kernel.split_chunks(width)
                i32 = torch.int32
                specs["topk_hist"] = e(2, m * p * 256, dt=i32)
                specs["topk_state"] = e(2, m * 2, dt=i32)
                specs["topk_counts"] = e(m * p * 2, dt=i32)
                # the scores' first-digit histograms (topk.SCORES_HISTOGRAM), left at zero
                specs["topk_first_hist"] = workspace_mod.Spec((m * p * 256,), i32, zeroed=True)
                # the one-launch form's row barriers (topk.ONE_LAUNCH), left at zero
                self.buf["topk_barriers"] = arrival.counters(2 * m, dev)
        # the step's scratch and outputs: the model's shared workspace (layers run one at a
        # time; views arrive at workspace.finalize()) or the layer's own
        if workspace is None:
            self.buf.update(workspace_mod.allocate(specs, dev))
        else:
            workspace.request(self, specs)

    def bind_caches(self, caches: Caches) -> None:
        """Point the layer at its rows of another cache pool (the serving pool, which exists
        only after the layers are built); host-only, so captured graphs see the new pool."""
        self.kv_cache = caches.kv[self.lw.layer_id]
        self.index_cache = caches.index.get(self.lw.layer_id)
        if self.runs_indexer and self.index_cache is None:
            raise ValueError(f"layer {self.lw.layer_id} runs the indexer but the pool has no "
                             "index cache for it")

    def _view(self, name: str, m: int) -> torch.Tensor:
        """The step's view of a buffer: its first m rows, contiguous (split-K partials and
        [slot, row] tables are indexed with the step's row count)."""
        buf = self.buf[name]
        if name in ("act", "slot_weight", "slot_rank"):  # [slots m rows can touch, rows, ...]
            return _prefix(buf, self._slots(m), m, *buf.shape[2:])
        if name in _ROWS_SECOND:  # [SPLIT, rows, ...]
            return _prefix(buf, buf.shape[0], m, *buf.shape[2:])
        return buf[:m]

    def _attention_parts(self, m: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The step's flash-decoding partials [m, splits(m), heads, ...] (fp32 o, then m/l)."""
        s = mla.attention_splits(m, self.cfg.index_topk)
        o, ml = self.buf["part_o"], self.buf["part_ml"]
        return _prefix(o, m, s, *o.shape[1:]), _prefix(ml, m, s, *ml.shape[1:])

    def _sm90_linear(self, dev):
        """fp8_mma's module when a linear runs on it (opt-in), refusing by name where it
        cannot."""
        opted = [env for env, on in ((sm90.O_PROJ_ENV, self.sm90_o),
                                     (sm90.QKV_A_ENV, self.sm90_qkv),
                                     (sm90.MOE_ENV, self.sm90_moe)) if on]
        if not opted:
            return None
        what = " and ".join(f"{env}=1" for env in opted)
        reason = sm90.refusal(dev, what)
        if reason is None and self.persistent:
            reason = f"{what} runs the stage kernels, not the persistent layer"
        if reason is not None:
            raise ValueError(f"layer {self.lw.layer_id}: {reason}")
        from sgl_kernel_ext.nvidia.sm90 import fp8_mma
        return fp8_mma

    def _sm90_attention(self, dev):
        """sparse_mla's module where this layer's attention runs on it (``sm90.ATTN_ENV``): by
        default wherever it can, logging once why not elsewhere; insisted on, refusing by name
        where it cannot."""
        setting = sm90.attn_setting()
        if setting is False:
            return None
        what = f"{sm90.ATTN_ENV}=1" if setting else "sm90 sparse_mla"
        reason = sm90.refusal(dev, what)
        if reason is None and self.persistent:
            reason = f"{what} runs the stage kernels, not the persistent layer"
        if reason is None and (self.heads, self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim) != (
                8, 512, 64):
            reason = (f"{what} takes 8 heads a rank and 512 + 64 latent columns, this layer "
                      f"{self.heads} and {self.cfg.kv_lora_rank} + {self.cfg.qk_rope_head_dim}")
        if reason is None:
            from sgl_kernel_ext.nvidia.sm90 import sparse_mla
            return sparse_mla
        if setting:
            raise ValueError(f"layer {self.lw.layer_id}: {reason}")
        _log_once(f"the sparse attention runs Triton's kernel: {reason}")
        return None

    def _sm90_topk(self, dev):
        """cluster_topk's module where this indexer layer's long-row top-k runs on it
        (``sm90.TOPK_ENV``): by default wherever it can, logging once why not elsewhere;
        insisted on, refusing by name where it cannot. None in a layer without the indexer."""
        setting = sm90.topk_setting()
        if setting is False or not self.runs_indexer:
            return None
        what = f"{sm90.TOPK_ENV}=1" if setting else "sm90 cluster_topk"
        reason = sm90.refusal(dev, what)
        if reason is None and self.persistent:
            reason = f"{what} runs the stage kernels, not the persistent layer"
        if reason is None:
            from sgl_kernel_ext.nvidia.sm90 import cluster_topk
            cluster_topk.prepare(dev)
            return cluster_topk
        if setting:
            raise ValueError(f"layer {self.lw.layer_id}: {reason}")
        _log_once(f"the indexer's top-k runs Triton's: {reason}")
        return None

    def _sm90_attn_side(self, dev):
        """(attn_side's module, {rows: its fixed form's workspace}) where this layer's q_a|kv_a,
        latent step and q_b run as its one launch (``sm90.ATTN_SIDE``), else (None, {}): by
        default wherever it can, logging once why not elsewhere; insisted on, refusing by name
        where the device cannot (a layer with the indexer keeps the stage kernels either way)."""
        setting = sm90.attn_side_setting()
        rows = min(self.max_rows, sm90.ATTN_SIDE_MAX_ROWS)
        if setting is False or rows < 1:
            return None, {}
        what = f"{sm90.ATTN_SIDE_ENV}=1" if setting else "sm90 attn_side"
        reason = sm90.refusal(dev, what)
        if reason is None and self.persistent:
            reason = f"{what} runs the stage kernels, not the persistent layer"
        if reason is None and self.runs_indexer:
            return None, {}  # its wq_b shares q_b's launch: the stage kernels, by design
        if reason is None:
            from sgl_kernel_ext.nvidia.sm90 import attn_side as side_mod
            a = self.lw.attn
            shape = side_mod.Shape(a.q_a.q.shape[0], a.kv_a.q.shape[0], a.q_a.q.shape[1],
                                   a.q_b.q.shape[0])
            try:
                forms = {r: side_mod.AttnSide(r, shape, eps=self.cfg.rms_norm_eps, fixed=True)
                         for r in range(1, rows + 1)}
            except ValueError as exc:
                reason = str(exc)
        if reason is not None:
            if setting:
                raise ValueError(f"layer {self.lw.layer_id}: {reason}")
            _log_once(f"q_a|kv_a, the latent step and q_b run the stage kernels: {reason}")
            return None, {}
        _log_once(f"q_a|kv_a, the latent step and q_b run as one attn_side launch at 1..{rows} "
                  "rows of the layers without the indexer")
        return side_mod, {r: _SideWork(f.split2, side_mod.workspace(f, dev))
                          for r, f in forms.items()}

    def _norm_in_applies(self, hidden, residual, m: int) -> bool:
        """Whether attn_side takes this step's input norm (sm90.ATTN_SIDE_NORM_IN_MAX_ROWS): a
        bf16 [m, H] hidden and residual, both contiguous (the first layer's residual is None:
        the norm kernel's)."""
        if m > sm90.ATTN_SIDE_NORM_IN_MAX_ROWS or residual is None or "residual_b" not in self.buf:
            return False
        shape = (m, self.cfg.hidden_size)
        return all(t.dtype == torch.bfloat16 and tuple(t.shape) == shape and t.is_contiguous()
                   for t in (hidden, residual))

    def _residual_apart(self, residual, m: int) -> torch.Tensor:
        """The residual buffer that is not `residual` (attn_side's norm_in writes the new
        residual while its other units still read the old one): the layers' shared residual
        and its twin take turns."""
        a, b = self._view("residual", m), self._view("residual_b", m)
        return b if residual.data_ptr() == a.data_ptr() else a

    def _run_attn_side(self, m: int, pos, slots, rows, norm_in=None) -> torch.Tensor:
        """q_a|kv_a, the latent step (the KV-cache rows) and q_b as attn_side's one launch
        (norm_in: the input norm's (hidden, residual, weight, new residual), taken inside it);
        returns q_b's split-K partials [split2, m, N] for absorb."""
        a, v = self.lw.attn, (lambda name: self._view(name, m))
        sw = self.attn_side_work[m]
        q_parts = _prefix(self.buf["q"], sw.split2, m, a.q_b.q.shape[0])
        self.attn_side.attn_side(
            self.buf["xq"][:self.attn_side.x_rows(m)], v("xs"), a.q_a.q, a.q_a.s, a.kv_a.q,
            a.kv_a.s, a.q_a_norm, a.q_b.q, a.q_b.s, None, v("rows_q"), q_parts, sw.work,
            eps=self.cfg.rms_norm_eps, pdl=overlap.enabled() and sm90.ATTN_SIDE_PDL, fixed=True,
            kv_norm=a.kv_a_norm, positions=pos, token_slots=slots, inv_freq=self.inv_freq,
            kv_cache=self.kv_cache, slot_rows=rows,
            early_dependents=sm90.ATTN_SIDE_EARLY_DEPENDENTS,
            early_slots=sm90.ATTN_SIDE_EARLY_SLOTS, norm_in=norm_in)
        return q_parts

    def _tails(self, n: int) -> int:
        """Column tiles of q_a|kv_a's matrices of n rows."""
        return -(-n // self.tile_qkv_a[0])

    def _latent_in_q_b(self, m: int) -> bool:
        """Whether q_b norms c_q itself this step (and writes the KV-cache rows) from
        q_a|kv_a's tails, instead of the latent kernel (mla.LATENT_IN_Q_B_MAX_ROWS): not in a
        layer with the indexer, whose q_b launch also carries wq_b."""
        bn = self.tile_qkv_a[0]
        return (m <= mla.LATENT_IN_Q_B_MAX_ROWS and not self.runs_indexer
                and self.cfg.q_lora_rank % bn == 0 and self.cfg.kv_lora_rank % bn == 0)

    def _q_b_parts(self, m: int, q_rows: bool) -> torch.Tensor:
        """q_b's split-K partials [split, m, N] this step: fewer K chunks where its tails sum
        absorb's rows in a layer without the indexer (mla.Q_B_SPLIT_WITH_ROWS; with the
        indexer, wq_b shares the launch and q_index's split)."""
        split = self.split_q_b
        if q_rows and not self.runs_indexer and 0 < mla.Q_B_SPLIT_WITH_ROWS < split:
            split = mla.Q_B_SPLIT_WITH_ROWS
        buf = self.buf["q"]
        return _prefix(buf, split, m, buf.shape[2])

    def _slots(self, m: int) -> int:
        """MoE slots m rows can touch: the shared expert and top-k per row (1 for dense)."""
        return m * self.cfg.num_experts_per_tok + 1 if self.experts else 1

    def __call__(self, hidden: torch.Tensor, residual: Optional[torch.Tensor], batch: RowBatch,
                 topk_prev: Optional[torch.Tensor] = None, reuse_topk: bool = False,
                 reduce: Optional[Reduce] = None, hidden_is_partial: bool = False
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of m rows: (y, residual, top-k positions). A layer without an indexer
        attends `topk_prev`; with `reuse_topk` an indexer layer does too (the MTP draft's
        top-k carried across its iterations): its indexer is skipped whole, as upstream skips
        it, so no index-K row is written and no scores or top-k are computed.

        y is this rank's MLP output, before the TP all-reduce (the caller's). On a TP shard,
        `reduce` (the TP group's all-reduce, bf16 [m, H] in and out) sums the attention
        output across the ranks before the post-attention norm, as a served step needs
        (``runtime.run_layers`` passes it); None: this rank's part alone, the reference's
        one-shard layer (tests and benchmarks: the same kernels, no exchange). A `reduce`
        that takes the norm after it into its launch (``peer_reduce.PeerReduce``) does so
        here; with `hidden_is_partial` (``runtime.run_layers``) `hidden` is this rank's part
        of the previous layer's MLP output, summed in the input norm's launch."""
        m = batch.num_rows
        if hidden_is_partial and not fuses_norm(reduce):
            raise ValueError("hidden_is_partial needs a reduce that takes the input norm into "
                             "its launch (a PeerReduce)")
        if "y" not in self.buf:
            raise RuntimeError("this layer's step buffers come from a Workspace that is not "
                               "finalized yet: build every layer, then call finalize()")
        if not 1 <= m <= self.max_rows:
            raise ValueError(f"{m} rows; this layer was built for 1..{self.max_rows}")
        if self.persistent:
            if reduce is not None and self.sharded:
                raise RuntimeError(
                    f"layer {self.lw.layer_id} holds {self.heads} of "
                    f"{self.cfg.num_attention_heads} attention heads (a TP shard) and the "
                    "persistent one-launch layer has no all-reduce inside its launch: run "
                    "TP > 1 on the stage kernels (SGL_KERNEL_EXT_PERSISTENT=0)")
            if hidden_is_partial:
                raise RuntimeError("the persistent one-launch layer has no all-reduce inside "
                                   "its launch: a partial hidden needs the stage kernels")
            return persistent_step.step(self, hidden, residual, batch, topk_prev, m, reuse_topk)
        with overlap.step_rows(m):
            return self._step(hidden, residual, batch, topk_prev, m, reuse_topk, reduce,
                              hidden_is_partial)

    def _step(self, hidden, residual, batch, topk_prev, m, reuse_topk=False, reduce=None,
              hidden_is_partial=False):
        cfg, lw, a = self.cfg, self.lw, self.lw.attn
        v = lambda name: self._view(name, m)  # noqa: E731
        pos, slots, rows = batch.positions, batch.slot_table, batch.slot_rows
        eps, c, rope = cfg.rms_norm_eps, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        res = v("residual")
        # the indexer's bf16 [wk; weights_proj] GEMM also reads the normed row unquantized
        x = v("x") if self.runs_indexer else None
        side = m in self.attn_side_work  # q_a|kv_a + latent + q_b: one attn_side launch
        norm_in = None  # the input norm inside attn_side's launch (sm90.ATTN_SIDE_NORM_IN_MAX_ROWS)
        if side and not hidden_is_partial and self._norm_in_applies(hidden, residual, m):
            res = self._residual_apart(residual, m)
            norm_in = (hidden, residual, lw.input_norm, res)
        elif hidden_is_partial:
            reduce.add_rms_norm(hidden, residual, lw.input_norm, eps, x, res, v("xq"), v("xs"))
        else:
            norm.add_rms_norm(hidden, residual, lw.input_norm, eps, x, res, v("xq"), v("xs"),
                              self.prefetch_regions if overlap.LAYER_PREFETCH else None)
        fused_latent = not side and self._latent_in_q_b(m)
        tails = (self.buf["qkv_arrivals"], v("rows_q"), v("ss_q"), v("rows_kv"), v("ss_kv"))
        q_side = None
        if side:
            q_side = self._run_attn_side(m, pos, slots, rows, norm_in)
        elif self.sm90_qkv and not fused_latent:
            self.sm90.fp8_mma(self.buf["xq"][:self.sm90.x_rows(m)], v("xs"), a.q_a.q, a.q_a.s,
                              v("qa"), stages=sm90.RING_SLOTS, pdl=overlap.enabled(),
                              wq2=a.kv_a.q, ws2=a.kv_a.s, parts2=v("kva"))
        else:
            fp8_linear.fp8_linear(v("xq"), v("xs"), a.q_a.q, a.q_a.s, v("qa"), a.kv_a.q,
                                  a.kv_a.s, v("kva"), *self.tile_qkv_a[:2],
                                  tails=tails if fused_latent else None)
        indexing = self.runs_indexer and not reuse_topk
        # the indexer's bf16 [wk; weights_proj] GEMM: programs of the latent launch (in steps of
        # the overlap's rows, where they run before its wait), or a launch of its own
        kw_in_latent = (indexing and not fused_latent and mla.KW_IN_LATENT
                        and m <= overlap.MAX_ROWS)
        if not fused_latent and not side:
            mla.latent(v("qa"), v("kva"), a.q_a_norm, a.kv_a_norm, eps, pos, slots, self.inv_freq,
                       v("cq_q"), v("cq_s"), self.kv_cache, c, rope,
                       kw=(v("x"), self.wk_proj, v("kw_parts")) if kw_in_latent else None,
                       slot_rows=rows)

        # absorb's q: q_b's fixed-point sums, summed by q_b's tails into bf16 rows, or q_b's
        # partials
        q_fixed = (not fused_latent and not side and not self.runs_indexer
                   and 0 < mla.Q_FIXED_FROM_ROWS <= m)
        q_rows = not fused_latent and not side and m >= mla.ABSORB_Q_ROWS_FROM and not q_fixed
        q_tails = (self.buf["q_arrivals"], v("q_rows"), None, None, None) if q_rows else None
        q_parts = self._q_b_parts(m, q_rows or q_fixed)
        q_sums = _prefix(self.buf["q_sums"], m, a.q_b.q.shape[0]) if q_fixed else None

        def q_b(*more):  # q_b (| the indexer's wq_b) on the normed c_q
            if fused_latent:
                mla.q_b_normed(v("rows_q"), v("ss_q"), a.q_a_norm, v("rows_kv"), v("ss_kv"),
                               a.kv_a_norm, eps, pos, slots, self.inv_freq, self.kv_cache, c,
                               rope, a.q_b.q, a.q_b.s, q_parts, *more, *self.tile_q_b[:2],
                               slot_rows=rows)
            else:
                fp8_linear.fp8_linear(v("cq_q"), v("cq_s"), a.q_b.q, a.q_b.s, q_parts, *more,
                                      *self.tile_q_b[:2], tails=q_tails, sums=q_sums)

        if indexing:
            ix = a.indexer
            q_b(ix.wq_b.q, ix.wq_b.s, v("q_index"))
            if not kw_in_latent:
                bf16_linear.bf16_linear_splitk(v("x"), self.wk_proj, v("kw_parts"))
            indexer.prepare(v("kw_parts"), v("q_index"), ix.k_norm_weight, ix.k_norm_bias,
                            cfg.index_k_norm_eps, pos, slots, self.inv_freq, self.index_cache,
                            v("q8"), v("head_w"), rope, slot_rows=rows)
            width = max(slots.shape[1], cfg.index_topk)
            if width > self.buf["scores"].shape[1]:
                raise ValueError(f"context width {width} > the {self.buf['scores'].shape[1]} "
                                 "built for")
            scores = self.buf["scores"][:m, :width]
            split = topk_kernel.use_split(width)
            topk = v("topk")
            # a long row's top-k as one cluster launch (sm90.TOPK), else the Triton split's
            cluster = split and self.sm90_topk is not None and not self.sm90_topk.refusal(
                scores, pos, cfg.index_topk, topk)
            first_hist = self.buf["topk_first_hist"] if (
                split and not cluster and topk_kernel.SCORES_HISTOGRAM) else None
            # rows of contexts within the top-k take them whole: their scores are not computed
            indexer.scores(v("q8"), v("head_w"), self.index_cache, pos, slots, scores,
                           first_hist=first_hist,
                           skip_within=cfg.index_topk if indexer.SCORE_SKIP_SHORT_ROWS else 0,
                           slot_rows=rows)
            if cluster:
                self.sm90_topk.topk_positions(scores, pos, cfg.index_topk, topk,
                                              pdl=overlap.enabled())
            elif split:
                topk_kernel.topk_positions_split(scores, pos, cfg.index_topk, topk,
                                                 self.buf["topk_hist"], self.buf["topk_state"],
                                                 self.buf["topk_counts"], self.buf["topk_barriers"],
                                                 first_hist)
            else:
                topk_kernel.topk_positions(scores, pos, cfg.index_topk, topk)
        else:
            if topk_prev is None:
                raise ValueError(f"layer {lw.layer_id} reuses the previous top-k but none was given")
            if not side:
                q_b(None, None, None)
            topk = topk_prev
        q_in = (q_side if side else q_sums[None] if q_fixed else v("q_rows")[None] if q_rows
                else q_parts)
        w_early = (m <= mla.ABSORB_W_EARLY_MAX_ROWS and sm90.ATTN_SIDE_ABSORB_W_EARLY
                   if side else None)
        mla.absorb(q_in, a.kv_b, pos, self.inv_freq,
                   v("qcat"), cfg.qk_nope_head_dim, rope, cfg.v_head_dim, indexer=indexing,
                   w_early=w_early,
                   early_dependents=mla.absorb_early_dependents(
                       m, indexing, kv_row_before_q_b=not (side or fused_latent)))
        attn_parts = self._attention_parts(m)
        vc = (self.buf["vc_parts"], self.buf["vc_arrivals"])
        vo = attn_out.applies(m) and not self.sm90_o
        merge = not (attn_out.merges(m) if vo else mla.absorb_v_merges(*vc, m))
        # the merge kernel before the one launch lets it start as the merge starts
        vo_early = vo and attn_out.EARLY_AFTER_COMBINE
        if self.sm90_attn is not None and sm90.ATTN_FROM_ROWS <= m <= sm90.ATTN_MAX_ROWS:
            self.sm90_attn.sparse_attention(v("qcat"), self.kv_cache, topk, slots,
                                            cfg.softmax_scale, *attn_parts, slot_rows=rows,
                                            pdl=overlap.enabled() and sm90.ATTN_PDL,
                                            stages=sm90.ATTN_STAGES,
                                            gatherers=sm90.attn_gatherers(m))
            if merge:
                mla.combine(*attn_parts, v("olat"), early_dependents=vo_early)
        else:
            mla.sparse_attention(v("qcat"), self.kv_cache, topk, slots, cfg.softmax_scale,
                                 *attn_parts, v("olat"), c, rope, merge=merge, slot_rows=rows,
                                 early_dependents=vo_early)
        o_tails = (self.buf["o_arrivals"], v("attn_rows"), None, None, None)
        if vo:  # one launch; on one rank the heads' partials, summed by the norm
            attn = v("vo_parts")
            attn_out.absorb_v_o_proj(v("olat"), attn_parts, not merge, a.kv_b,
                                     cfg.qk_nope_head_dim, cfg.v_head_dim, a.o_proj.q,
                                     a.o_proj.s, self.buf["vo_sums"], self.buf["vo_counts"],
                                     attn, o_tails[:2] if self.sharded else None, zero=q_sums)
        else:
            mla.absorb_v(v("olat"), a.kv_b, v("oq"), v("os"), cfg.qk_nope_head_dim,
                         cfg.v_head_dim, *vc, attn_parts, zero=q_sums)
            if self.sm90_o:
                self.sm90.fp8_mma(self.buf["oq"][:self.sm90.x_rows(m)], v("os"), a.o_proj.q,
                                  a.o_proj.s, v("y_attn"), stages=sm90.RING_SLOTS,
                                  pdl=overlap.enabled(),
                                  tails=o_tails[:2] if self.sharded else None)
            else:
                fp8_linear.fp8_linear(v("oq"), v("os"), a.o_proj.q, a.o_proj.s, v("y_attn"),
                                      *(None,) * 3, *self.tile_o[:2],
                                      tails=o_tails if self.sharded else None)
            attn = v("y_attn")  # one rank holds every head: the split-K partials
        if self.sharded and fuses_norm(reduce):  # the all-reduce and the norm: one launch
            reduce.add_rms_norm(v("attn_rows"), res, lw.post_attention_norm, eps, v("x2"), res,
                                v("x2q"), v("x2s"))
        else:
            if self.sharded:
                attn = v("attn_rows") if reduce is None else reduce(v("attn_rows"))
                if attn.shape != (m, cfg.hidden_size) or attn.dtype != torch.bfloat16:
                    raise ValueError(f"the all-reduce returned {tuple(attn.shape)} "
                                     f"{attn.dtype}; the norm reads bf16 [{m}, {cfg.hidden_size}]")
                if self.experts and self.fp8_moe is None and norm_router.applies(m):
                    # no norm launch: the router reads the un-normed row (norm_router)
                    self._mlp(pos, m, norm_free=(attn.contiguous(), res))
                    return v("y"), res, topk
            norm.add_rms_norm(attn.contiguous(), res, lw.post_attention_norm, eps, v("x2"), res,
                              v("x2q"), v("x2s"),
                              self.next_regions if overlap.NEXT_LAYER_PREFETCH else None)
        self._mlp(pos, m)
        return v("y"), res, topk

    def routed_experts(self, m: int) -> torch.Tensor:
        """Experts each row of the last step was routed to, int64 [m, top-k] ascending (-1 for
        a pad row). Reads the slot table back to the host: for tests and check mode only."""
        k = self.cfg.num_experts_per_tok
        n = int(self.buf["num_slots"])
        experts = self.buf["slot_expert"][1:n].long().cpu()
        weights = self._view("slot_weight", m)[1:n].cpu()
        out = torch.full((m, k), -1, dtype=torch.int64)
        for r in range(m):
            chosen = experts[weights[:, r] > 0].sort().values
            out[r, : len(chosen)] = chosen
        return out

    def _mlp(self, pos: torch.Tensor, m: int, norm_free=None) -> None:
        """norm_free = (attn, res): the post-attention norm did not run; the router reads
        attn + res un-normed and the terms' sum writes the residual (``norm_router``)."""
        cfg, mlp, b = self.cfg, self.lw.mlp, self.buf
        v = lambda name: self._view(name, m)  # noqa: E731
        routing = None
        ss, eps = None, cfg.rms_norm_eps
        if self.experts:
            parts = v("router_parts")
            if norm_free is not None:
                split = norm_router.launch(m)[1]
                parts = _prefix(b["nr_parts"], split, m, self.experts)
                ss = _prefix(b["nr_ss"], split, m)
            if self.fp8_moe is None and m <= moe.ROUTE_IN_GATE_UP_MAX_ROWS:
                routing = moe.Routing(parts, mlp.bias, pos, cfg.num_experts_per_tok,
                                      cfg.routed_scaling_factor, cfg.norm_topk_prob,
                                      v("slot_weight"), v("slot_rank"))
            scratch = (b["route_chosen"], b["route_weight"], b["route_arrival"])
            if norm_free is not None:
                sums = None
                if routing is None and norm_router.fixed(m):
                    sums = _prefix(b["nr_sums"], m, self.experts)
                norm_router.norm_router(*norm_free, self.lw.post_attention_norm, mlp.router,
                                        parts, ss, v("x2q"), v("x2s"), sums=sums)
                if routing is None:
                    moe.route(parts if sums is None else sums, mlp.bias, pos,
                              cfg.num_experts_per_tok, cfg.routed_scaling_factor,
                              cfg.norm_topk_prob, b["slot_expert"],
                              v("slot_weight"), v("slot_rank"), b["num_slots"], scratch, ss=ss,
                              hidden=cfg.hidden_size, eps=eps)
            else:
                moe.router_route(v("x2"), mlp.router, v("router_parts"), mlp.bias, pos,
                                 cfg.num_experts_per_tok, cfg.routed_scaling_factor,
                                 cfg.norm_topk_prob, b["slot_expert"], v("slot_weight"),
                                 v("slot_rank"), b["num_slots"], b["route_arrival"], scratch,
                                 routes=routing is None)
            routed, shared = mlp, mlp.shared
        else:
            routed = shared = mlp  # the dense MLP is the single shared slot
        if self.fp8_moe is not None:
            self._experts_sm90(pos, m)
            return
        act = v("act")
        dense = not self.experts
        tiling = moe.gate_up_tiling(m, dense)
        split_k = tiling[2]
        gu_parts = None
        if split_k > 1:
            gu_parts = _prefix(b["gu_parts"], split_k, act.shape[0], m, 2, act.shape[2])
        block_n, warps = moe.down_shape(m, dense)
        ready = None
        if self.experts and routing is None and m >= moe.DOWN_SLOT_WAIT_FROM_ROWS:
            ready = moe.SlotWait(b["down_ready"][:-1], b["down_ready"][-1:],
                                 -(-act.shape[2] // tiling[0]))
        with overlap.wide():
            moe.gate_up(v("x2q"), v("x2s"), self.experts, b["slot_expert"], b["num_slots"],
                        routed.gate.q, routed.gate.s, routed.up.q, routed.up.s,
                        shared.gate.q, shared.gate.s, shared.up.q, shared.up.s, act, gu_parts,
                        tiling=tiling, arrivals=b["gu_arrivals"], route=routing, ready=ready,
                        ss=ss, eps=eps)
            moe.down(v("act"), self.experts, b["slot_expert"], v("slot_weight"),
                     v("slot_rank"), b["num_slots"], routed.down.q, routed.down.s,
                     shared.down.q, shared.down.s, pos, v("terms"), v("y"), block_n=block_n,
                     num_warps=warps, table_early=routing is None, ready=ready,
                     residual=norm_free)


    def health(self) -> List[str]:
        """What the kernels' own error words say after a step (check mode; syncs with the
        host): fp8_moe.experts' flags, which a completed launch leaves at zero, and attn_side's,
        attn_out's and down's failure words (set where one of its waits gave up: wrong output
        rather than a hang)."""
        problems = []
        if attn_out.failed(self.buf["vo_counts"], self.heads):
            problems.append(f"layer {self.lw.layer_id}: a wait of absorb_v_o_proj gave up")
        if moe.slot_wait_failed(self.buf["down_ready"][-1:]):
            problems.append(f"layer {self.lw.layer_id}: a slot wait of down gave up")
        for rows, sw in sorted(self.attn_side_work.items()):
            try:
                self.attn_side.check_sync(sw.work)
            except RuntimeError as exc:
                problems.append(f"layer {self.lw.layer_id}, {rows} rows: {exc}")
        if self.fp8_moe is not None and sm90.MOE_ONE_LAUNCH:
            problems += self.fp8_moe.flags_problems(self.buf["moe_flags"])
        return problems

    def _experts_sm90(self, pos: torch.Tensor, m: int) -> None:
        """The experts on fp8_moe, launched programmatically dependent: gate/up with SwiGLU
        and the down input's quant, and down, in one launch (``experts``; sm90.MOE_ONE_LAUNCH)
        or two; then Triton's sum of each row's terms."""
        mlp, b = self.lw.mlp, self.buf
        v = lambda name: self._view(name, m)  # noqa: E731
        q = self.fp8_moe
        s, nx, inter = self._slots(m), self.sm90.x_rows(m), mlp.shared.gate.q.shape[0]
        act_q = _prefix(b["moe_act_q"], s * nx, inter)
        act_s = _prefix(b["moe_act_s"], s * m, -(-inter // 128))
        rows = b["moe_parts"].numel() // (m * 2 * inter)
        parts = _prefix(b["moe_parts"], rows, m, 2 * inter)
        table, pdl = b["slot_expert"][:s], overlap.enabled()
        arrivals = b["moe_arrivals"][:s * (inter // 128)]
        if sm90.MOE_ONE_LAUNCH:
            q.experts(b["x2q"], v("x2s"), mlp.gate.q, mlp.gate.s, mlp.up.q, mlp.up.s,
                      mlp.down.q, mlp.down.s, mlp.shared.gate.q, mlp.shared.gate.s,
                      mlp.shared.up.q, mlp.shared.up.s, mlp.shared.down.q, mlp.shared.down.s,
                      table, b["num_slots"], v("slot_weight"), v("slot_rank"), parts,
                      arrivals, b["moe_flags"][:q.flags_size(s, inter)], act_q, act_s,
                      v("terms"), pdl=pdl)
        else:
            q.gate_up(b["x2q"], v("x2s"), mlp.gate.q, mlp.gate.s, mlp.up.q, mlp.up.s,
                      mlp.shared.gate.q, mlp.shared.gate.s, mlp.shared.up.q, mlp.shared.up.s,
                      table, b["num_slots"], parts, arrivals, act_q, act_s, pdl=pdl)
            q.down(act_q, act_s, mlp.down.q, mlp.down.s, mlp.shared.down.q, mlp.shared.down.s,
                   table, b["num_slots"], v("slot_weight"), v("slot_rank"), v("terms"),
                   pdl=pdl)
        moe.sum_terms(v("terms"), pos, v("y"))


class _SideWork(NamedTuple):
    """One row count's attn_side form in a layer: its q_b split and its workspace (made once:
    the flags' epochs and the fixed sums' parity carry from launch to launch)."""

    split2: int
    work: object


def chain_prefetch(layers) -> None:
    """Give each layer the next one's prefetch table (the last the first's: the next step
    starts there), for overlap.NEXT_LAYER_PREFETCH."""
    for layer, nxt in zip(layers, list(layers[1:]) + list(layers[:1])):
        layer.next_regions = nxt.prefetch_regions


def build_fused_layer(cfg: Glm5Config, lw: LayerWeights, caches: Caches, max_rows: int,
                      max_context: Optional[int] = None,
                      persistent_launch: Optional[bool] = None,
                      workspace: Optional["workspace_mod.Workspace"] = None) -> FusedLayer:
    """Build one rank's fused layer for steps of 1..max_rows rows (see the module docstring);
    persistent_launch: one launch per step (default: only with SGL_KERNEL_EXT_PERSISTENT=1);
    workspace: shared with the model's other layers (usable after its ``finalize``)."""
    return FusedLayer(cfg, lw, caches, max_rows, max_context, persistent_launch, workspace)
