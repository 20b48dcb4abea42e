"""GLM-5.3 (``GlmMoeDsaForCausalLM``) and its MTP draft (``GlmMoeDsaForCausalLMNextN``).

The classes the architectures resolve to in the fork. ``forward`` keeps upstream's signature
(graph runners inspect it) and branches by ``fused_mode``: a covered step (the plan's widths
for its forward mode) runs the fused layers (``_fused_forward``) and hands the post-norm hidden
state to upstream's logits processor; every other step runs upstream's forward unchanged.
The decision reads only the forward mode and the row count, so a captured CUDA graph bakes a
stable choice. Without a plan (``--fused-decode-backend off``, the default) nothing changes.

The NextN draft branches the same way: a covered draft-decode step (``spec.draft_widths``)
runs the draft's own input path in torch (embedding, enorm / hnorm of the embedding and of the
handed-over hidden state, eh_proj; ``fused_decode.draft``), its one decoder layer on the fused
layer, and ``shared_head.norm``; draft-extend and every other step run upstream's forward.
Under ``index_share_for_mtp_iteration`` upstream sets ``reuse_dsa_topk_indices`` on the draft's
decode steps and carries one top-k across them in ``spec_info.dsa_topk_indices``: a fused draft
step then attends that top-k (converted to context positions on the device, in the index space
the DSA backend's ``use_fused_topk`` says it is in; ``fused_decode.carry``) with its indexer
skipped, or, with none carried yet, runs its indexer and publishes its own top-k there for the
next iterations, as upstream's draft does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from sglang.srt.layers.fused_decode import carry as topk_carry
from sglang.srt.layers.fused_decode import check, draft, plan as fused_plan, runtime
from sglang.srt.model_executor.forward_context import (
    get_attn_backend,
    get_req_to_token_pool,
    get_token_to_kv_pool,
)
from sglang.srt.models import glm4_moe as _upstream

STATE_KEY = "_fused_decode"  # in the module's __dict__, out of its state dict


@dataclass
class FusedState:
    """What install_fused_decode leaves on the model: the plan and its upstream joins."""

    plan: Any  # fused_decode.plan.Plan
    weights: List[Any]  # LayerWeights views, for check mode
    verify_rows_per_req: int
    reduce: Callable[[torch.Tensor], torch.Tensor]
    is_capturing: Callable[[], bool] = lambda: False
    rank: int = 0
    steps: int = 0  # fused steps run eagerly or captured on this rank
    caches: Dict[int, Any] = field(default_factory=dict)  # id(pool) -> runtime Caches
    pool_ids: Dict[int, int] = field(default_factory=dict)  # plan layer id -> pool layer
    draft: Any = None  # the MTP draft's MtpWeights (a draft model's state only)
    carry: Any = None  # the draft's carry.TopkCarry (index_share_for_mtp_iteration)


def fused_mode(state: Optional[FusedState], forward_batch: Any, rows: int,
               input_embeds: Any = None, pp_proxy_tensors: Any = None) -> Optional[str]:
    """The covered mode of this step ('decode' / 'target_verify'), or None for upstream's path."""
    if state is None or input_embeds is not None or pp_proxy_tensors is not None:
        return None
    mode = forward_batch.forward_mode
    name = "decode" if mode.is_decode() else "target_verify" if mode.is_target_verify() else None
    return name if state.plan.covers(name, rows) else None


def branch(model: Any, input_ids, positions, forward_batch: Any, input_embeds: Any = None,
           pp_proxy_tensors: Any = None) -> Tuple[Optional[FusedState], Optional[str]]:
    """(the model's fused state, this step's covered mode or None): the forward's branch."""
    state = model.__dict__.get(STATE_KEY)
    rows = input_ids.shape[0] if input_ids is not None else positions.shape[0]
    return state, fused_mode(state, forward_batch, rows, input_embeds, pp_proxy_tensors)


class GlmMoeDsaForCausalLM(_upstream.GlmMoeDsaForCausalLM):
    """GLM-5.3 target model."""

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        input_embeds: torch.Tensor = None,
        pp_proxy_tensors: Optional[Any] = None,
    ) -> Any:
        state, mode = branch(self, input_ids, positions, forward_batch, input_embeds,
                             pp_proxy_tensors)
        if mode is None:
            return super().forward(
                input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors
            )
        hidden = self._fused_forward(state, mode, input_ids, positions, forward_batch)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def _fused_forward(self, state: FusedState, mode: str, input_ids, positions, forward_batch):
        spec_info = forward_batch.spec_info
        if getattr(spec_info, "dsa_seed_topk_capture", None) is not None:
            raise RuntimeError("fused decode: this step asks for an MTP top-k seed, which the "
                               "fused target step does not publish")
        if mode == "target_verify":
            per_req = getattr(spec_info, "draft_token_num", state.verify_rows_per_req)
            if per_req != state.verify_rows_per_req:
                raise RuntimeError(f"fused decode: a verify step of {per_req} tokens per request; "
                                   f"the plan was built for {state.verify_rows_per_req}")
        hidden = self.model.embed_tokens(input_ids)
        norm = self.model.norm
        return run_step(state, mode, hidden, positions, forward_batch,
                        lambda h, r: norm(h, r)[0])


class GlmMoeDsaForCausalLMNextN(_upstream.GlmMoeDsaForCausalLMNextN):
    """GLM-5.3 MTP draft model."""

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        pp_proxy_tensors: Optional[Any] = None,
    ) -> Any:
        state, mode = branch(self, input_ids, positions, forward_batch,
                             pp_proxy_tensors=pp_proxy_tensors)
        if mode is None:
            return super().forward(input_ids, positions, forward_batch, pp_proxy_tensors)
        hidden = self._fused_forward(state, mode, input_ids, positions, forward_batch)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def _fused_forward(self, state: FusedState, mode: str, input_ids, positions, forward_batch):
        share = bool(getattr(forward_batch, "reuse_dsa_topk_indices", False))
        if share and state.carry is None:
            raise RuntimeError("fused draft: this step carries a top-k across draft steps "
                               "(index_share_for_mtp_iteration) but the draft was built "
                               "without its carry buffers")
        nm, mtp = self.model, state.draft
        hidden = draft.eh_hidden(nm.embed_tokens(input_ids), forward_batch.spec_info.hidden_states,
                                 mtp.enorm, mtp.hnorm, mtp.eh_proj, state.plan.cfg.rms_norm_eps)
        norm = nm.shared_head.norm
        return run_step(state, mode, hidden, positions, forward_batch,
                        lambda h, r: norm(h, r)[0], share_topk=share)


def carried_topk(state: FusedState, spec_info: Any, rows: Any) -> Optional[torch.Tensor]:
    """The top-k this draft step attends in place of its indexer: upstream's carry in
    `spec_info.dsa_topk_indices` as context positions (None: none carried yet, the layer runs
    its indexer). Upstream's DSA backend reads it as physical slots when its fused top-k is on,
    else as positions; a carry this draft published is positions already."""
    seed = getattr(spec_info, "dsa_topk_indices", None)
    if seed is None:
        return None
    c = state.carry
    if c.holds(seed):
        return c.take(seed, rows, topk_carry.POSITIONS)
    fused_topk = getattr(get_attn_backend(), "use_fused_topk", None)
    if fused_topk is None:
        raise RuntimeError("fused draft: the attention backend does not say in which index "
                           "space it carries the top-k (no use_fused_topk)")
    return c.take(seed, rows, topk_carry.SLOTS if fused_topk else topk_carry.POSITIONS)


def run_step(state: FusedState, mode: str, hidden: torch.Tensor, positions: torch.Tensor,
             forward_batch: Any, final_norm: Callable, share_topk: bool = False) -> torch.Tensor:
    """The plan's layers on upstream's pool for this step (the first layer's input `hidden`),
    then `final_norm(hidden, residual)`: the post-norm hidden state [rows, H]. `share_topk`
    (the MTP draft under upstream's index share): attend the top-k carried in
    ``spec_info.dsa_topk_indices``, or compute it, and leave it there for the next iteration."""
    plan = state.plan
    pool = get_token_to_kv_pool()
    caches = state.caches.get(id(pool))
    if caches is None:
        from .adapt import pool_buffers

        kv, index = pool_buffers(pool, plan.layer_ids, plan.cfg, state.pool_ids)
        caches = state.caches[id(pool)] = runtime.pool_caches(kv, index, plan.cfg.kv_cache_dim)
    fused_plan.bind_caches(plan, caches)
    rows = runtime.step_rows(
        positions, get_req_to_token_pool().req_to_token,
        forward_batch.req_pool_indices,
        state.verify_rows_per_req if mode == "target_verify" else 1,
        plan.max_context, forward_batch.num_token_non_padded,
    )
    if state.draft is None:  # the fault test stalls the target's step n only
        runtime.maybe_inject_stall(state.rank, state.steps)
    state.steps += 1
    carried = carried_topk(state, forward_batch.spec_info, rows) if share_topk else None
    hook = None
    if check.enabled() and not state.is_capturing():
        step = f"{mode} {hidden.shape[0]} rows" + (" of the MTP draft" if state.draft else "")
        check.check_write_slots(rows, forward_batch.out_cache_loc, step)
        hook = check.Checker(plan.cfg, state.weights, caches, step)
    out = runtime.run_layers(plan.layers, hidden, rows, state.reduce, final_norm, hook, carried)
    if share_topk:  # the next iteration attends this step's top-k (positions), as upstream's
        forward_batch.spec_info.dsa_topk_indices = state.carry.published(hidden.shape[0])
    return out


EntryClass = [GlmMoeDsaForCausalLM, GlmMoeDsaForCausalLMNextN]
