"""Server tests of the fused decode path, for a GPU box with the fork installed and a GLM-5.3
checkpoint (README, "End-to-end tests"). Everything skips, with the reason, elsewhere.

Environment:
  SGLANG_GLM5MEGA_E2E_MODEL    checkpoint path or hub id (required)
  SGLANG_GLM5MEGA_E2E_TP       tensor-parallel size (default 8)
  SGLANG_GLM5MEGA_E2E_BACKEND  the --fused-decode-backend under test (default triton)
  SGLANG_GLM5MEGA_E2E_ARGS     extra server arguments (e.g. the speculative settings)
  SGLANG_GLM5MEGA_GSM8K        a local GSM8K test.jsonl (else upstream's script downloads it)
"""

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pytest

MODEL = os.environ.get("SGLANG_GLM5MEGA_E2E_MODEL")
TP = int(os.environ.get("SGLANG_GLM5MEGA_E2E_TP", "8"))
BACKEND = os.environ.get("SGLANG_GLM5MEGA_E2E_BACKEND", "triton")
EXTRA = shlex.split(os.environ.get("SGLANG_GLM5MEGA_E2E_ARGS", ""))


def skip_reason() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.device_count() < TP:
        return f"{torch.cuda.device_count()} GPUs, the test needs SGLANG_GLM5MEGA_E2E_TP={TP}"
    if not MODEL:
        return "SGLANG_GLM5MEGA_E2E_MODEL (a GLM-5.3 checkpoint) is not set"
    try:
        from sglang.srt.layers.fused_decode import spec
        from sglang.srt.models.glm5_mega import hooks  # noqa: F401  the fork is installed
    except ImportError as e:
        return f"the fork is not installed ({e})"
    if BACKEND not in spec.BUILT_IMPLEMENTATIONS | spec.UNVERIFIED_IMPLEMENTATIONS:
        return (f"--fused-decode-backend {BACKEND} has no kernels in this build "
                f"(spec.BUILT_IMPLEMENTATIONS={sorted(spec.BUILT_IMPLEMENTATIONS)}, "
                f"UNVERIFIED_IMPLEMENTATIONS={sorted(spec.UNVERIFIED_IMPLEMENTATIONS)})")
    return None


def backend_env() -> dict:
    """The server environment the backend under test needs: the opt-in for kernels not yet
    verified end to end (this run is what verifies them)."""
    from sglang.srt.layers.fused_decode import spec

    return {} if BACKEND in spec.BUILT_IMPLEMENTATIONS else {spec.UNVERIFIED_ENV: "1"}


def pytest_collection_modifyitems(config, items):
    reason = skip_reason()
    if reason:
        for item in items:
            if "/e2e/" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def launch(tmp_path: Path, *args: str, fused: bool = True, env: Optional[dict] = None,
           port: int = 31000, timeout: float = 1800, wait: bool = True) -> Server:
    """Start a server (the fused backend, or off) and wait until it answers /health."""
    import requests

    log = tmp_path / f"server-{port}.log"
    cmd: List[str] = [sys.executable, "-m", "sglang.launch_server", "--model-path", MODEL,
                      "--tp", str(TP), "--port", str(port), "--trust-remote-code", *EXTRA,
                      *args, "--fused-decode-backend", BACKEND if fused else "off"]
    out = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, **(backend_env() if fused else {}), **(env or {})},
                            start_new_session=True)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.time() + timeout
    while wait:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{server.text()[-5000:]}")
        try:
            if requests.get(server.url + "/health", timeout=5).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.time() > deadline:
            server.stop()
            raise TimeoutError(f"server not ready after {timeout} s:\n{server.text()[-5000:]}")
        time.sleep(5)
    return server


@pytest.fixture
def server_factory(tmp_path):
    servers = []

    def make(*args, **kwargs):
        s = launch(tmp_path, *args, port=31000 + 10 * len(servers), **kwargs)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
