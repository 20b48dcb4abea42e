"""GSM8K, 200 questions (5-shot, greedy), with and without the fused path: the fused server
must score within 2 points of the stock one, and above an absolute floor."""

import os
from types import SimpleNamespace

FLOOR = float(os.environ.get("SGLANG_GLM5MEGA_GSM8K_FLOOR", "0.90"))


def _gsm8k(server, parallel):
    from sglang.test.few_shot_gsm8k import run_eval

    host, port = server.url.rsplit(":", 1)
    args = SimpleNamespace(num_shots=5, data_path=os.environ.get("SGLANG_GLM5MEGA_GSM8K"),
                           num_questions=200, max_new_tokens=512, parallel=parallel,
                           host=host, port=int(port), temperature=0.0)
    return run_eval(args)["accuracy"]


def test_gsm8k_with_and_without_the_flag(server_factory):
    stock = server_factory(fused=False)
    stock_acc = _gsm8k(stock, parallel=4)
    stock.stop()
    fused = server_factory()
    fused_acc = _gsm8k(fused, parallel=4)  # 4 requests: decode steps of covered widths
    assert fused_acc >= FLOOR, (fused_acc, stock_acc)
    assert fused_acc >= stock_acc - 0.02, (fused_acc, stock_acc)
