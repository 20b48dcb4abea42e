"""KL of decode against prefill, per covered width: W requests decode together (steps of W
rows on the fused path), then each generated sequence is scored by prefill (upstream's path)
and the per-token top-k log-probabilities are compared."""

import math
import os

import pytest
import requests

WIDTHS = [int(w) for w in os.environ.get("SGLANG_GLM5MEGA_KL_WIDTHS", "1,2,4,8,16").split(",")]
TOP = 20
MEAN_KL = float(os.environ.get("SGLANG_GLM5MEGA_KL_BOUND", "0.02"))
PROMPTS = ["Explain why the sky is blue.", "Write a haiku about compilers.",
           "List three prime numbers and prove one is prime.", "What is 17 * 23?"]


def _post(url, payload):
    r = requests.post(url + "/generate", json=payload, timeout=600)
    r.raise_for_status()
    return r.json()


def _kl(p_top, q_top):
    """KL(p || q) over p's top tokens (q's missing entries at q's smallest logprob)."""
    q = {tok: lp for lp, tok, *_ in q_top}
    floor = min(q.values())
    return sum(math.exp(lp) * (lp - q.get(tok, floor)) for lp, tok, *_ in p_top)


@pytest.mark.parametrize("width", WIDTHS)
def test_decode_vs_prefill_kl(server_factory, width):
    server = server_factory("--max-running-requests", str(width))
    prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(width)]
    out = _post(server.url, {"text": prompts, "return_logprob": True,
                             "logprob_start_len": 0, "top_logprobs_num": TOP,
                             "sampling_params": {"temperature": 0, "max_new_tokens": 64}})
    kls = []
    for item in out:
        meta = item["meta_info"]
        ids = [t for _, t, *_ in meta["input_token_logprobs"]]
        gen = [t for _, t, *_ in meta["output_token_logprobs"]]
        scored = _post(server.url, {"input_ids": ids + gen, "return_logprob": True,
                                    "logprob_start_len": len(ids) - 1, "top_logprobs_num": TOP,
                                    "sampling_params": {"max_new_tokens": 0}})
        prefill_top = scored["meta_info"]["input_top_logprobs"][1:]
        for dec, pre in zip(meta["output_top_logprobs"], prefill_top):
            kls.append(_kl(pre, dec))
    mean = sum(kls) / len(kls)
    assert mean <= MEAN_KL, (width, mean, max(kls))
