"""The GLM-5.3 MTP (NextN) draft step over rows: the ground truth for the fused draft.

One draft step of M rows: h = eh_proj([RMSNorm_e(embed(token)); RMSNorm_h(prev_hidden)]), the
draft's decoder layer (MLA with its own indexer, MoE; ``layer_id == num_hidden_layers``) with no
input residual, the head norm (``shared_head.norm``, adding the layer's deferred residual) and
the shared LM head. ``prev_hidden`` is the post-norm hidden state of the row's previous token
(the target's on the first draft step). Returns the fp32 logits and the post-norm hidden state,
which the next draft step takes as its ``prev_hidden``. Works for decode rows and prefill rows
alike (``RowBatch``), so it also fills a draft cache for a prompt.

``draft_iterations`` is SGLang's EAGLE (top-k 1) draft loop under the config's
``index_share_for_mtp_iteration``: one DSA top-k is carried across the loop's iterations. The
first iteration attends the seed (the draft layer's top-k at the request's last draft-extend
row, ``draft_step_topk`` on those rows) or, without one, runs its indexer; every later
iteration attends the first's top-k with its indexer skipped whole (no index-K row written).
The carried top-k is in context positions of the row's request.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .batch import RowBatch
from .cache import Caches
from .config import Glm5Config
from .model import layer_forward
from .ops import add_rms_norm, rms_norm
from .quant import SGLANG, Numerics, bf16_linear
from .weights import MtpWeights


def draft_input(cfg: Glm5Config, mtp: MtpWeights, embeds: torch.Tensor,
                prev_hidden: torch.Tensor, num: Numerics = SGLANG) -> torch.Tensor:
    """The decoder layer's input: eh_proj of the two normalized halves, [M, H]."""
    eps, dt = cfg.rms_norm_eps, num.act_dtype
    x = torch.cat((rms_norm(embeds, mtp.enorm, eps, dt), rms_norm(prev_hidden, mtp.hnorm, eps, dt)),
                  dim=-1)
    return bf16_linear(x, mtp.eh_proj, dt)


def draft_step(cfg: Glm5Config, mtp: MtpWeights, embed: torch.Tensor, lm_head: torch.Tensor,
               input_ids: torch.Tensor, prev_hidden: torch.Tensor, batch: RowBatch,
               caches: Caches, topk_prev: Optional[torch.Tensor] = None,
               num: Numerics = SGLANG) -> Tuple[torch.Tensor, torch.Tensor]:
    """One draft step (TP1): (fp32 logits [M, vocab], post-norm hidden [M, H]). Writes the
    draft layer's KV and index-K rows at each valid row's slot of ``caches``."""
    logits, out, _ = draft_step_topk(cfg, mtp, embed, lm_head, input_ids, prev_hidden, batch,
                                     caches, topk_prev, num)
    return logits, out


def draft_step_topk(cfg: Glm5Config, mtp: MtpWeights, embed: torch.Tensor, lm_head: torch.Tensor,
                    input_ids: torch.Tensor, prev_hidden: torch.Tensor, batch: RowBatch,
                    caches: Caches, carried: Optional[torch.Tensor] = None,
                    num: Numerics = SGLANG) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``draft_step`` that also returns the top-k positions the layer attended [M, index_topk].
    Given `carried` (a top-k carried across draft iterations), the layer attends it and skips
    its indexer: no index-K row is written."""
    embeds = embed[input_ids.clamp_min(0)].to(num.act_dtype)
    hidden = draft_input(cfg, mtp, embeds, prev_hidden, num)
    y, residual, topk = layer_forward(cfg, [mtp.layer], hidden, None, batch, caches, carried, num,
                                      reuse_topk=carried is not None)
    out, _ = add_rms_norm(y, residual, mtp.head_norm, cfg.rms_norm_eps, num.act_dtype)
    return bf16_linear(out, lm_head, torch.float32), out, topk


def draft_iterations(cfg: Glm5Config, mtp: MtpWeights, embed: torch.Tensor,
                     lm_head: torch.Tensor, input_ids: torch.Tensor, prev_hidden: torch.Tensor,
                     batch: RowBatch, caches: Caches, iterations: int,
                     seed: Optional[torch.Tensor] = None, num: Numerics = SGLANG
                     ) -> Tuple[List[Tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The draft loop with one top-k carried across it (see the module docstring), greedy as
    EAGLE top-k 1: iteration i's rows are one position past iteration i-1's (pad rows stay
    -1), its tokens the previous logits' argmax, its ``prev_hidden`` the previous post-norm
    hidden state. Returns [(logits, hidden)] per iteration and the carried top-k."""
    steps, carried = [], seed
    ids, prev, pos = input_ids, prev_hidden, batch.positions
    for i in range(iterations):
        rows = RowBatch(pos, batch.token_slots)
        logits, prev, topk = draft_step_topk(cfg, mtp, embed, lm_head, ids, prev, rows, caches,
                                             carried, num)
        carried = topk
        steps.append((logits, prev))
        ids = logits.argmax(-1)
        pos = torch.where(pos >= 0, pos + 1, pos)
    return steps, carried
