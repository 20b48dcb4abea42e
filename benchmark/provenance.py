"""A digest of the code a timing ran, computable on the device and from git history alike.

A device call's copy of the tree carries no usable git history (its HEAD is a stale
snapshot), so a result names its commit through BENCH_COMMIT, typed by hand. A valid sha that
is the wrong commit passes every check of the name alone. This digest is the check of the
content: on the device it hashes the files that decide a timing (the fork's Python, the
extension's kernels, the benchmark scripts) as git hashes blobs; on CPU the same digest
comes from ``git ls-tree`` of the named commit, and the two must agree
(``test_results_provenance.py``). A tree with uncommitted edits gives a digest no commit has.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Dict, Iterable, Tuple

# (directory, whether to descend, file suffixes): the code a timing depends on
ROOTS: Tuple[Tuple[str, bool, Tuple[str, ...]], ...] = (
    ("python", True, (".py",)),
    ("sgl-kernel-ext/sgl_kernel_ext", True, (".py",)),
    ("benchmark", False, (".py", ".sh")),
)


def _selected(path: str) -> bool:
    for root, deep, suffixes in ROOTS:
        prefix = root + "/"
        if not path.startswith(prefix) or not path.endswith(suffixes):
            continue
        if deep or "/" not in path[len(prefix):]:
            return True
    return False


def blob_sha(data: bytes) -> str:
    """git's object id of a file's bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def digest(blobs: Dict[str, str]) -> str:
    """sha256 over the sorted (path, blob id) pairs of the selected files."""
    h = hashlib.sha256()
    for path in sorted(p for p in blobs if _selected(p)):
        h.update(f"{path} {blobs[path]}\n".encode())
    return h.hexdigest()


def _walk(repo: Path) -> Iterable[str]:
    for root, _, _ in ROOTS:
        base = repo / root
        if base.is_dir():
            yield from (f.relative_to(repo).as_posix() for f in base.rglob("*") if f.is_file())


def tree_digest(repo: Path) -> str:
    """The digest of the working tree at ``repo`` (what the device ran)."""
    return digest({p: blob_sha((repo / p).read_bytes()) for p in _walk(repo) if _selected(p)})


def commit_digest(repo: Path, commit: str) -> str:
    """The digest of ``commit``'s tree, from git (no checkout)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--full-tree", commit],
                         capture_output=True, text=True, check=True).stdout
    blobs = {}
    for line in out.splitlines():
        info, _, path = line.partition("\t")
        _, kind, sha = info.split()
        if kind == "blob":
            blobs[path] = sha
    return digest(blobs)
