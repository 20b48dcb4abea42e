"""An injected stall of one rank stops every rank with an error, and no token of the stalled
step is returned. Rank 1 sleeps before its fused step N (SGLANG_FUSED_DECODE_INJECT_STALL,
eager decode); the other ranks wait in that step's first all-reduce until upstream's watchdog
(--watchdog-timeout) stops the server. Needs TP >= 2."""

import json
import os
import time

import pytest
import requests

TP = int(os.environ.get("SGLANG_GLM5MEGA_E2E_TP", "8"))

STALL_STEP = 8


@pytest.mark.skipif(TP < 2, reason="the stall of one rank needs TP >= 2")
def test_stalled_rank_stops_every_rank(server_factory):
    server = server_factory(
        "--disable-cuda-graph", "--max-running-requests", "1", "--watchdog-timeout", "60",
        env={"SGLANG_FUSED_DECODE_INJECT_STALL": f"1:{STALL_STEP}:3600"})
    tokens, error = 0, None
    try:
        with requests.post(server.url + "/generate", stream=True, timeout=900, json={
                "text": "Write a long story.", "stream": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": 256}}) as r:
            for line in r.iter_lines():
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    error = chunk["error"]
                    break
                tokens = chunk["meta_info"]["completion_tokens"]
    except requests.RequestException as e:
        error = e
    # fused steps 0..STALL_STEP-1 returned tokens (prefill gives the first one); none after
    assert error is not None or server.proc.poll() is not None
    assert tokens <= STALL_STEP + 1, tokens
    deadline = time.time() + 600
    while server.proc.poll() is None and time.time() < deadline:
        time.sleep(5)
    assert server.proc.poll() is not None, "the server kept running after a rank stalled"
    assert server.proc.returncode != 0
