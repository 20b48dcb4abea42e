"""Build the fork's wheel: the pinned upstream wheel, patched by the series, plus the overlay.

The result is one ``sglang`` distribution at version ``<upstream>+<local>`` with upstream's
dependencies plus ``sgl-kernel-ext``, the upstream wheel's tag, a regenerated RECORD, and a
``FORK.json`` in its dist-info that says what it was built from (pin, patches, overlay files).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import time
import zipfile
from pathlib import Path
from typing import Callable

from .pin import fetch_wheel, interpreter_tag, read_pin
from .series import apply_series, load_series

EXT_REQUIREMENT_ENV = "SGLANG_GLM5MEGA_EXT_REQUIREMENT"
EXT_DIR = "sgl-kernel-ext"
OVERLAY_DIR = "python"


class BuildError(RuntimeError):
    pass


def overlay_files(repo: Path) -> dict[str, bytes]:
    """Every file of the overlay tree, keyed by its path inside the wheel."""
    root = repo / OVERLAY_DIR
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def ext_requirement(repo: Path) -> str:
    """How the fork names its extension: the sibling source tree unless told otherwise."""
    override = os.environ.get(EXT_REQUIREMENT_ENV)
    if override:
        return override
    ext = repo / EXT_DIR
    if not (ext / "pyproject.toml").is_file():
        raise BuildError(
            f"{EXT_DIR}/ is missing; set {EXT_REQUIREMENT_ENV} to a requirement for it"
        )
    # "/.": pip keeps a wheel built from a direct-URL folder whose name looks like
    # name-version ("sgl-kernel-ext") in its persistent cache and would reinstall that stale
    # build after the sources change; a path ending in "." is built afresh every time.
    return f"sgl-kernel-ext @ {ext.resolve().as_uri()}/."


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _fork_metadata(metadata: str, version: str, requirement: str) -> str:
    head, sep, body = metadata.partition("\n\n")
    out = []
    inserted = False
    for line in head.splitlines():
        if line.startswith("Version:"):
            line = f"Version: {version}"
        if line.startswith("Requires-Dist:") and not inserted:
            out.append(f"Requires-Dist: {requirement}")
            inserted = True
        out.append(line)
    if not inserted:
        out.append(f"Requires-Dist: {requirement}")
    return "\n".join(out) + sep + body


def build_fork_wheel(
    repo: Path, out_dir: Path, log: Callable[[str], None] = print
) -> Path:
    start = time.perf_counter()
    pin = read_pin(repo / "UPSTREAM.toml")
    pinned = pin.wheel_for(interpreter_tag())
    source = fetch_wheel(pinned, log)
    patches = load_series(repo / "patches")
    overlay = overlay_files(repo)
    requirement = ext_requirement(repo)
    old_info = f"{pin.name}-{pin.version}.dist-info"
    new_info = f"{pin.name}-{pin.fork_version}.dist-info"
    out_path = out_dir / f"{pin.name}-{pin.fork_version}-{pinned.tag}.whl"

    with zipfile.ZipFile(source) as zin:
        members = {info.filename: info for info in zin.infolist()}

        def read(path: str):
            info = members.get(path)
            return None if info is None or info.is_dir() else zin.read(info).decode()

        changed, reports = apply_series(patches, read)
        for report in reports:
            log(f"patch {report.name}: applied ({report.hunks} hunks in {len(report.files)} files)")
        clashes = sorted(set(overlay) & (set(members) | set(changed)))
        if clashes:
            raise BuildError(f"overlay files would replace upstream files: {clashes}")

        entries: list[tuple[str, bytes]] = []
        for name, info in members.items():
            if info.is_dir() or name == f"{old_info}/RECORD":
                continue
            if name in changed:
                continue
            data = zin.read(info)
            if name.startswith(old_info + "/"):
                name = new_info + name[len(old_info) :]
                if name.endswith("/METADATA"):
                    data = _fork_metadata(data.decode(), pin.fork_version, requirement).encode()
                elif name.endswith("/WHEEL"):
                    data = data.replace(
                        b"Generator: ", b"Generator: sglang-glm5mega forkbuild, from "
                    )
            entries.append((name, data))
    entries += [(path, text.encode()) for path, text in changed.items() if text is not None]
    entries += list(overlay.items())
    provenance = {
        "upstream": {"name": pin.name, "version": pin.version, "wheel": pinned.filename,
                     "sha256": pinned.sha256},
        "version": pin.fork_version,
        "patches": [
            {"name": r.name, "subject": r.subject, "files": r.files, "hunks": r.hunks}
            for r in reports
        ],
        "overlay": sorted(overlay),
        "sgl_kernel_ext": requirement.split(" @ ")[0],
    }
    entries.append((f"{new_info}/FORK.json", json.dumps(provenance, indent=1).encode()))

    out_dir.mkdir(parents=True, exist_ok=True)
    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(out_path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for name, data in entries:
            zout.writestr(name, data)
            rows.writerow([name, _record_hash(data), len(data)])
        rows.writerow([f"{new_info}/RECORD", "", ""])
        zout.writestr(f"{new_info}/RECORD", record.getvalue())
    log(
        f"built {out_path.name}: {len(reports)} patches, {len(overlay)} overlay files, "
        f"{time.perf_counter() - start:.1f} s"
    )
    return out_path
