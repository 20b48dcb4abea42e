"""Every committed benchmark result names the commit it measured, and that commit exists.

A result JSON under benchmark/results/ carries its commit in ``meta.commit`` (or a top-level
``commit``; the earliest ones only in their file name, ``..._<sha>.json``). A device call
names it through BENCH_COMMIT, typed by hand: a mistyped sha would leave numbers no one can
trace, so each must resolve to a commit of this repository's history. A ``+suffix`` marks a
tree modified from that commit (the run says how) and is allowed.
"""

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmark" / "results"
SHA = re.compile(r"^[0-9a-f]{7,40}$")


def _commit_of(path: Path):
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        meta = data.get("meta")
        for holder in (meta if isinstance(meta, dict) else {}, data):
            if holder.get("commit"):
                return str(holder["commit"])
    named = re.search(r"_([0-9a-f]{7})\.json$", path.name)
    return named.group(1) if named else None


@functools.lru_cache(maxsize=None)
def _known(sha: str) -> bool:
    done = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{sha}^{{commit}}"],
                          capture_output=True)
    return done.returncode == 0


def test_every_result_names_a_commit_of_this_history():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history (a checkout, not an installed copy)")
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True).stdout.strip()
    if shallow == "true":
        pytest.skip("a shallow clone lacks the history the results name")
    files = sorted(RESULTS.glob("*.json"))
    assert files, f"no results under {RESULTS}"
    problems = []
    for path in files:
        commit = _commit_of(path)
        if commit is None:
            problems.append(f"{path.name}: names no commit")
            continue
        sha = commit.split("+", 1)[0]
        if not SHA.match(sha):
            problems.append(f"{path.name}: commit {commit!r} is not a sha")
        elif not _known(sha):
            problems.append(f"{path.name}: commit {commit!r} is not in this history")
    assert not problems, "\n".join(problems)


def test_a_mistyped_commit_is_caught(tmp_path):
    """The check itself: a sha that names no commit fails, a real one passes, and the file
    name serves where the JSON names none."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history (a checkout, not an installed copy)")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    good = tmp_path / "probe_x.json"
    good.write_text(json.dumps({"meta": {"commit": head + "+edits"}}))
    bad = tmp_path / "probe_y.json"
    bad.write_text(json.dumps({"meta": {"commit": "0000000"}}))
    by_name = tmp_path / f"probe_{head}.json"
    by_name.write_text(json.dumps({"rows": []}))
    assert _known(_commit_of(good).split("+")[0])
    assert not _known(_commit_of(bad))
    assert _commit_of(by_name) == head
