"""A scratch git repository holding upstream files with one commit per patch.

``check --scratch`` leaves one for editing, ``refresh`` turns its commits back into patch
files, and ``rebase`` cherry-picks its patch commits onto another upstream release so git's
3-way merge carries them across.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

from .unidiff import Patch

BASE_TAG = "upstream"
_IDENTITY = ["-c", "user.name=sglang-glm5mega", "-c", "user.email=forkbuild@localhost"]


class GitError(RuntimeError):
    pass


class Scratch:
    def __init__(self, root: Path):
        self.root = root

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["git", *_IDENTITY, "-c", "core.autocrlf=false", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
        )
        if check and result.returncode != 0:
            raise GitError(f"git {' '.join(args)}: {result.stderr.strip()}")
        return result

    @classmethod
    def create(cls, root: Path, files: dict[str, str | bytes], message: str) -> "Scratch":
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise GitError(f"scratch directory {root} is not empty")
        scratch = cls(root)
        scratch.git("init", "-q", "-b", "main")
        scratch.write(files)
        scratch.commit(message)
        scratch.git("tag", BASE_TAG)
        return scratch

    def write(self, files: dict[str, Optional[str | bytes]]) -> None:
        for path, data in files.items():
            target = self.root / path
            if data is None:
                target.unlink(missing_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, bytes):
                target.write_bytes(data)
            else:
                target.write_text(data)

    def read(self, path: str) -> Optional[str]:
        target = self.root / path
        return target.read_text() if target.is_file() else None

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD").stdout.strip()

    def commit_patch(self, patch: Patch, changed: dict[str, Optional[str]]) -> str:
        self.write(changed)
        return self.commit(f"{patch.name}\n\n{patch.header.strip()}\n")

    def dirty_files(self) -> list[str]:
        out = self.git("status", "--porcelain").stdout
        return [line[3:] for line in out.splitlines()]

    def patch_commits(self, base: str = BASE_TAG) -> list[str]:
        out = self.git("rev-list", "--reverse", f"{base}..HEAD").stdout
        return out.split()

    def message(self, commit: str) -> tuple[str, str]:
        """(patch name, header) stored in a patch commit's message."""
        text = self.git("log", "-1", "--format=%B", commit).stdout
        name, _, header = text.partition("\n")
        return name.strip(), header.strip() + "\n"

    def diff(self, commit: str) -> str:
        return self.git(
            "diff", "--no-color", "--no-ext-diff", "--no-renames", "-U3", f"{commit}^", commit
        ).stdout

    def patch_text(self, commit: str) -> tuple[str, str]:
        name, header = self.message(commit)
        return name, f"{header}\n{self.diff(commit)}"
