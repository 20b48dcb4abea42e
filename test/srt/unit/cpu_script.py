"""Run one of this folder's CPU model scripts (glm5_cpu_model.py, glm5_cpu_draft.py) in its
own process, as upstream's loader needs a fresh process group and a free port, and return the
JSON it writes."""

import json
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(name: str, out_dir: Path, timeout: int = 900) -> dict:
    out = out_dir / "out.json"
    proc = subprocess.run([sys.executable, str(HERE / name), str(out), str(_free_port())],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())
