"""Strict unified-diff patches: parse them and apply them with no fuzz and no offset.

A hunk applies only where its header says, after the shift of the earlier hunks of the same
file, and only if every context and removed line matches exactly. Anything else is a
``PatchError`` naming the patch, the file and the hunk, and where that hunk's old lines are
found instead, if anywhere, so a rebase knows what moved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = "\\ No newline at end of file"


class PatchError(RuntimeError):
    def __init__(self, patch: str, file: str, hunk: Optional[int], header: str, reason: str):
        self.patch, self.file, self.hunk, self.header, self.reason = (
            patch,
            file,
            hunk,
            header,
            reason,
        )
        where = f"hunk #{hunk} ({header})" if hunk else "file"
        super().__init__(f"patch {patch}: file {file}: {where}: {reason}")


@dataclass
class Hunk:
    header: str
    old_start: int
    new_start: int
    lines: list[str]  # each keeps its ' ', '-' or '+' prefix and its line ending

    def old(self) -> list[str]:
        return [l[1:] for l in self.lines if l[0] in " -"]

    def new(self) -> list[str]:
        return [l[1:] for l in self.lines if l[0] in " +"]


@dataclass
class FilePatch:
    old_path: Optional[str]  # None: the patch creates the file
    new_path: Optional[str]  # None: the patch deletes the file
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path


@dataclass
class Patch:
    name: str
    header: str  # free text before the first diff: why, what it touches, when to drop it
    files: list[FilePatch]


def _strip_prefix(path: str) -> Optional[str]:
    path = path.split("\t")[0].strip()
    if path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse_patch(name: str, text: str) -> Patch:
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and not lines[i].startswith(("diff --git ", "--- ")):
        i += 1
    header = "".join(lines[:i])
    files: list[FilePatch] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise PatchError(name, line[4:].strip(), None, "", "'---' without '+++'")
            files.append(FilePatch(_strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])))
            i += 2
        elif line.startswith("@@"):
            if not files:
                raise PatchError(name, "?", None, line.strip(), "hunk before any file header")
            i = _parse_hunk(name, files[-1], lines, i)
        else:
            i += 1  # diff --git, index, mode lines: the ---/+++ pair carries the paths
    if not files:
        raise PatchError(name, "-", None, "", "no file diffs found")
    return Patch(name=name, header=header, files=files)


def _parse_hunk(name: str, fp: FilePatch, lines: list[str], i: int) -> int:
    match = _HUNK_RE.match(lines[i])
    if not match:
        raise PatchError(name, fp.path, None, lines[i].strip(), "malformed hunk header")
    old_len = int(match.group(2) if match.group(2) is not None else 1)
    new_len = int(match.group(4) if match.group(4) is not None else 1)
    hunk = Hunk(
        header=lines[i].rstrip("\n").split(" @@")[0] + " @@",
        old_start=int(match.group(1)),
        new_start=int(match.group(3)),
        lines=[],
    )
    i += 1
    olds = news = 0
    while i < len(lines) and (olds < old_len or news < new_len):
        line = lines[i]
        tag = line[:1]
        if line.rstrip("\n") == "":  # some editors strip the lone space of blank context
            line, tag = " " + line, " "
        if tag not in " -+":
            break
        hunk.lines.append(line)
        olds += tag in " -"
        news += tag in " +"
        i += 1
        if i < len(lines) and lines[i].rstrip("\n") == NO_NEWLINE:
            hunk.lines[-1] = hunk.lines[-1].rstrip("\n")
            i += 1
    if (olds, news) != (old_len, new_len):
        raise PatchError(
            name,
            fp.path,
            len(fp.hunks) + 1,
            hunk.header,
            f"hunk body has {olds} old and {news} new lines, header says {old_len} and {new_len}",
        )
    fp.hunks.append(hunk)
    return i


def _find(haystack: list[str], needle: list[str]) -> list[int]:
    if not needle:
        return []
    return [
        k
        for k in range(len(haystack) - len(needle) + 1)
        if haystack[k : k + len(needle)] == needle
    ]


def apply_file_patch(patch_name: str, fp: FilePatch, text: Optional[str]) -> Optional[str]:
    """The file's text after fp (None when fp deletes it); PatchError when a hunk misses."""
    if fp.old_path is None and text is not None:
        raise PatchError(patch_name, fp.path, None, "", "creates a file that already exists")
    if fp.old_path is not None and text is None:
        raise PatchError(patch_name, fp.path, None, "", "file does not exist in the tree")
    lines = (text or "").splitlines(keepends=True)
    shift = 0
    for number, hunk in enumerate(fp.hunks, start=1):
        old = hunk.old()
        at = (hunk.old_start - 1 if old else hunk.old_start) + shift
        if lines[at : at + len(old)] != old:
            found = [k + 1 for k in _find(lines, old)]
            where = (
                f"its lines are at line {', '.join(map(str, found[:5]))} instead"
                if found
                else "its context and removed lines are not in the file"
            )
            raise PatchError(
                patch_name,
                fp.path,
                number,
                hunk.header,
                f"does not apply at line {at + 1}; {where}",
            )
        new = hunk.new()
        lines[at : at + len(old)] = new
        shift += len(new) - len(old)
    if fp.new_path is None:
        if lines:
            raise PatchError(patch_name, fp.path, None, "", "deletion leaves lines behind")
        return None
    return "".join(lines)


def apply_patch(
    patch: Patch, read: Callable[[str], Optional[str]], changed: dict[str, Optional[str]]
) -> None:
    """Apply patch over the tree seen through read(), recording results in changed."""
    for fp in patch.files:
        source = fp.old_path or fp.path
        text = changed[source] if source in changed else read(source)
        result = apply_file_patch(patch.name, fp, text)
        if fp.old_path and fp.new_path and fp.old_path != fp.new_path:
            changed[fp.old_path] = None
        changed[fp.path] = result
