"""The GLM-5.3 MTP (NextN) draft step over rows: the ground truth for the fused draft.

One draft step of M rows: h = eh_proj([RMSNorm_e(embed(token)); RMSNorm_h(prev_hidden)]), the
draft's decoder layer (MLA with its own indexer, MoE; ``layer_id == num_hidden_layers``) with no
input residual, the head norm (``shared_head.norm``, adding the layer's deferred residual) and
the shared LM head. ``prev_hidden`` is the post-norm hidden state of the row's previous token
(the target's on the first draft step). Returns the fp32 logits and the post-norm hidden state,
which the next draft step takes as its ``prev_hidden``. Works for decode rows and prefill rows
alike (``RowBatch``), so it also fills a draft cache for a prompt.
"""

from __future__ import annotations

from typing import Optional, Tuple

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
    embeds = embed[input_ids.clamp_min(0)].to(num.act_dtype)
    hidden = draft_input(cfg, mtp, embeds, prev_hidden, num)
    y, residual, _ = layer_forward(cfg, [mtp.layer], hidden, None, batch, caches, topk_prev, num)
    out, _ = add_rms_norm(y, residual, mtp.head_norm, cfg.rms_norm_eps, num.act_dtype)
    return bf16_linear(out, lm_head, torch.float32), out
