"""PEP 517 build backend of the fork (``pip install .`` at the repository root).

It needs nothing beyond the standard library: the wheel is assembled from the pinned
upstream wheel, the patch series and the overlay (see ``wheel.py``). Editable installs and
sdists are not offered: the fork is built from a checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .pin import PinError
from .unidiff import PatchError
from .wheel import BuildError, build_fork_wheel

REPO = Path(__file__).resolve().parents[2]


def _log(message: str) -> None:
    print(f"[sglang-glm5mega] {message}", file=sys.stderr, flush=True)


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        path = build_fork_wheel(REPO, Path(wheel_directory), log=_log)
    except (PinError, PatchError, BuildError) as exc:
        _log(f"build stopped: {exc}")
        raise SystemExit(f"sglang-glm5mega build failed: {exc}") from exc
    return path.name
