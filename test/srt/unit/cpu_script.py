"""Run one of this folder's CPU model scripts (glm5_cpu_model.py, glm5_cpu_draft.py,
tp2_cpu_step.py) in its own process, as upstream's loader needs a fresh process group and a
free port, and return the JSON it writes.

Each takes one to two minutes of one core while pytest itself runs on one, so the scripts of
the selected test modules (their ``CPU_SCRIPT``) start when collection ends (conftest's
``pytest_collection_finish``), at a lower priority: they run on the core the tests leave idle,
and the module's fixture then waits for its script's result."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
_started = {}  # script name -> (its process, its folder: out.json, stdout, stderr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str) -> None:
    """Start the script now (once), niced, its output going to files (a pipe nobody reads
    would block it)."""
    if name in _started:
        return
    folder = Path(tempfile.mkdtemp(prefix=f"{Path(name).stem}-"))
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / name), str(folder / "out.json"), str(_free_port())],
            stdout=out, stderr=err, text=True, start_new_session=True)  # a group of its own
    os.setpriority(os.PRIO_PROCESS, proc.pid, 10)  # before it spawns anything (tp2's ranks)
    _started[name] = (proc, folder)


def run_script(name: str, timeout: int = 900) -> dict:
    """The script's JSON, from its early start if it had one (else it starts now)."""
    start(name)
    proc, folder = _started[name]
    try:
        proc.wait(timeout=timeout)
        log = (folder / "stdout").read_text()[-3000:] + (folder / "stderr").read_text()[-6000:]
        assert proc.returncode == 0, log
        return json.loads((folder / "out.json").read_text())
    finally:
        stop(name)


def stop(name: str) -> None:
    """Kill the script and whatever it spawned (tp2's ranks) if it still runs, and remove its
    folder."""
    proc, folder = _started.pop(name)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


def stop_all() -> None:
    """At the session's end: the scripts whose tests never asked (deselected, or stopped by -x)."""
    for name in list(_started):
        stop(name)
