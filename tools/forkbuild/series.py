"""The patch series (patches/series): ordered upstream edits, each with a required header.

Every patch starts with a header of ``Key: value`` fields (continuation lines indented)
before its first diff: ``Subject`` (one line), ``Why``, ``Touches`` and ``Drop-When``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .unidiff import Patch, PatchError, apply_patch, parse_patch

HEADER_FIELDS = ("Subject", "Why", "Touches", "Drop-When")
_FIELD_RE = re.compile(r"^([A-Za-z-]+):[ \t]*(.*)$")


@dataclass
class PatchReport:
    name: str
    subject: str
    files: list[str]
    hunks: int


def series_names(patches_dir: Path) -> list[str]:
    series = patches_dir / "series"
    if not series.is_file():
        raise PatchError("series", str(series.name), None, "", "patches/series is missing")
    names = []
    for raw in series.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def header_fields(patch: Patch) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for line in patch.header.splitlines():
        match = _FIELD_RE.match(line)
        if match and match.group(1) in HEADER_FIELDS:
            key = match.group(1)
            fields[key] = match.group(2).strip()
        elif key and line.startswith((" ", "\t")):
            fields[key] = (fields[key] + " " + line.strip()).strip()
        elif line.strip():
            key = None
    missing = [f for f in HEADER_FIELDS if not fields.get(f)]
    if missing:
        raise PatchError(patch.name, "-", None, "", f"header lacks {', '.join(missing)}")
    return fields


def load_series(patches_dir: Path) -> list[Patch]:
    patches = []
    for name in series_names(patches_dir):
        path = patches_dir / name
        if not path.is_file():
            raise PatchError(name, "-", None, "", "listed in patches/series but missing")
        patch = parse_patch(name, path.read_text())
        header_fields(patch)
        patches.append(patch)
    return patches


def apply_series(
    patches: list[Patch], read: Callable[[str], Optional[str]]
) -> tuple[dict[str, Optional[str]], list[PatchReport]]:
    """Apply the series in order over read(); returns changed files and one report a patch."""
    changed: dict[str, Optional[str]] = {}
    reports = []
    for patch in patches:
        apply_patch(patch, read, changed)
        reports.append(
            PatchReport(
                name=patch.name,
                subject=header_fields(patch)["Subject"],
                files=[fp.path for fp in patch.files],
                hunks=sum(len(fp.hunks) for fp in patch.files),
            )
        )
    return changed, reports
