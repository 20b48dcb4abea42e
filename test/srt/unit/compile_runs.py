"""sm90_compile.py run in a child process, for the compile tests: its recording needs the
Triton interpreter and its compiling must not have it, so neither shares pytest's process."""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(mode, specs, *args, interpret=False, triton_dir=None):
    """sm90_compile.py MODE SPECS ARGS... (a CompletedProcess); triton_dir: a Triton to
    compile with instead of the venv's."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if triton_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(triton_dir),
                                                          env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(HERE / "sm90_compile.py"), mode, str(specs),
                           *args], capture_output=True, text=True, timeout=900, env=env)


def record(record_mode, path):
    """The launches a recording mode writes to path (record, record-real-stages)."""
    recorded = run(record_mode, path, interpret=True)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    assert "distinct launches" in recorded.stdout
    return path


def compile_every(specs, target="sm90", triton_dir=None):
    """Compile every recorded launch for the target, each within its shared memory limit;
    returns the Triton version that compiled them."""
    compiled = run("compile", specs, target, triton_dir=triton_dir)
    assert compiled.returncode == 0, compiled.stdout[-4000:] + compiled.stderr[-2000:]
    assert "FAIL" not in compiled.stdout
    n = len(json.loads(Path(specs).read_text()))
    summary = compiled.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"compiled {n} of {n} for {target} with Triton "), summary
    return summary.rsplit(" ", 1)[-1]
