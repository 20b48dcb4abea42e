"""KL check of decode against prefill: the same prefix must give the same next-token distribution.

For prompts decoded greedily for N steps with all requests as rows of each step, every decoded
position's distribution is compared with the distribution at that position in one prefill of the
whole sequence (prompt + generated tokens; causal, so one prefill gives every prefix).
KL(prefill || decode) per position; mean and max are reported.

Measured on the tiny config (CPU, seeds 0-4, 6 prompts x 12 steps, 2 pad rows): all-fp32
activations mean/max ~7e-13 / 2e-12 (summation order only); SGLang numerics (bf16 + FP8
activations) mean 4e-5 .. 5.7e-3, max 6e-4 .. 0.26 on one CPU, but mean 0.047 .. 0.108, max
0.44 .. 1.21 on an AVX512-BF16/AMX Xeon (1 pad row): decode and prefill differ only in fp32
accumulation order (the BLAS library's choice per CPU), which every bf16/FP8 rounding point
amplifies, and in a tiny random model a flipped top-k or expert choice moves a distribution by
up to ~1. Bounds used in test_reference_kl.py: fp32 1e-9; SGLang mean 0.25, max 2.5, argmax
agreeing at >= 16 of 24 positions (a decode reading a wrong slot: mean 0.57, 4 of 24). For
scale: the same decode on
CPU and on an H200 differs by KL 2.7e-12 (fp32) and mean 0.056 / max 0.12 (SGLang numerics).
Against a dense prefill (SGLang's choice up to 2048 tokens): 0 while contexts fit in
index_topk, but mean ~0.6-0.7, max ~2-3 on the tiny model once they exceed its top-k of 16, so
an end-to-end KL check against upstream SGLang on a tiny model keeps contexts <= index_topk.
"""

from __future__ import annotations

from typing import Dict, Sequence

import torch

from .config import Glm5Config
from .engine import ReferenceEngine
from .model import Reduce, sum_partials
from .quant import SGLANG, Numerics


def kl_div(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim, from logits, in fp64."""
    lp = torch.log_softmax(p_logits.double(), dim=-1)
    lq = torch.log_softmax(q_logits.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(dim=-1)


def decode_vs_prefill_kl(
    cfg: Glm5Config,
    weights,
    prompts: Sequence[Sequence[int]],
    steps: int,
    num: Numerics = SGLANG,
    reduce: Reduce = sum_partials,
    device: str = "cpu",
    num_slots: int = 1024,
    pad_rows: int = 0,
    seed: int = 0,
    dense_prefill: bool = False,
) -> Dict[str, object]:
    """KL(prefill || decode) over every decoded position; `dense_prefill` compares against a
    prefill that attends densely (SGLang's choice up to 2048 tokens) instead of sparsely."""
    eng = ReferenceEngine(cfg, weights, num_slots, device, num, reduce, seed)
    rids, _, step_logits = eng.generate(prompts, steps, pad_rows)
    # the sequence whose prefill reproduces every decode step: prompt + tokens fed to decode
    seqs = [eng.requests[r].tokens for r in rids]
    ref = ReferenceEngine(cfg, weights, num_slots, device, num, reduce, seed + 1)
    ref_rids = [ref.add_request(s, len(s)) for s in seqs]
    pre = ref.prefill(ref_rids, dense=dense_prefill)
    kls = []
    for m, p in enumerate(prompts):
        plen = len(p)
        for n in range(steps):
            kls.append(kl_div(pre[m][plen + n], step_logits[n][m]))
    k = torch.stack(kls).float()
    agree = sum(
        int(pre[m][len(p) + n].argmax() == step_logits[n][m].argmax())
        for m, p in enumerate(prompts) for n in range(steps)
    )
    return {"mean": float(k.mean()), "max": float(k.max()), "positions": k.numel(),
            "argmax_agree": agree, "finite": bool(torch.isfinite(k).all())}
