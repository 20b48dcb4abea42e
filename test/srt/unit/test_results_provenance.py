"""Every committed benchmark result names the commit it measured, and that commit exists.

A result JSON under benchmark/results/ carries its commit in ``meta.commit`` (or a top-level
``commit``; the earliest ones only in their file name, ``..._<sha>.json``). A device call
names it through BENCH_COMMIT, typed by hand: a mistyped sha would leave numbers no one can
trace, so each must resolve to a commit of this repository's history. A ``+suffix`` marks a
tree modified from that commit (the run says how) and is allowed. Results since 2026-12-07
also carry ``meta.tree_digest`` (``benchmark/provenance.py``): the hash of the files that
ran, which must be the named commit's.
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


def _needs_history():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history (a checkout, not an installed copy)")


def test_every_result_names_a_commit_of_this_history():
    _needs_history()
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
    _needs_history()
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



def test_every_digested_result_ran_the_commit_it_names():
    """A result whose run hashed its tree (``meta.tree_digest``, harness.run_meta) names the
    commit whose files those were: the name alone cannot tell a valid sha of another commit."""
    _needs_history()
    from benchmark import provenance

    problems = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        meta = data.get("meta") if isinstance(data, dict) else None
        if not isinstance(meta, dict) or not meta.get("tree_digest"):
            continue
        commit = str(meta.get("commit", ""))
        if "+" in commit:  # a tree modified from that commit, said so by the run
            continue
        if not _known(commit):
            problems.append(f"{path.name}: commit {commit!r} is not in this history")
        elif provenance.commit_digest(ROOT, commit) != meta["tree_digest"]:
            problems.append(f"{path.name}: the tree that ran is not commit {commit}")
    assert not problems, "\n".join(problems)


def test_the_tree_digest_tells_a_commit_from_its_edits(tmp_path):
    """The check itself: HEAD's files unpacked from git hash to HEAD's digest; one byte
    changed in a kernel, or a new file beside them, gives another."""
    _needs_history()
    from benchmark import provenance

    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "--", "python",
                              "sgl-kernel-ext/sgl_kernel_ext", "benchmark/*.py",
                              "benchmark/*.sh"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    head = provenance.commit_digest(ROOT, "HEAD")
    assert provenance.tree_digest(tmp_path) == head
    kernel = tmp_path / "sgl-kernel-ext" / "sgl_kernel_ext" / "triton" / "norm_router.py"
    kernel.write_bytes(kernel.read_bytes() + b"\n")
    assert provenance.tree_digest(tmp_path) != head
    kernel.write_bytes(kernel.read_bytes()[:-1])
    assert provenance.tree_digest(tmp_path) == head
    (tmp_path / "benchmark" / "extra_probe.py").write_text("x = 1\n")
    assert provenance.tree_digest(tmp_path) != head
