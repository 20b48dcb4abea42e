"""Check mode: with SGLANG_FUSED_DECODE_CHECK=1 and eager decode, the reference runs beside
every covered layer and logs each value outside spec.NUMERICS; a clean run logs none."""

import requests


def test_check_mode_is_clean(server_factory):
    server = server_factory("--disable-cuda-graph", "--max-running-requests", "4",
                            env={"SGLANG_FUSED_DECODE_CHECK": "1"})
    prompts = ["Count from one to twenty.", "Name the planets.", "What is a monad?", "Hi."]
    r = requests.post(server.url + "/generate", timeout=1800, json={
        "text": prompts, "sampling_params": {"temperature": 0, "max_new_tokens": 32}})
    r.raise_for_status()
    log = server.text()
    assert "fused decode covers" in log  # the plan was built and logged by rank 0
    problems = [line for line in log.splitlines() if "fused decode check:" in line]
    assert problems == [], "\n".join(problems[:50])
