"""The upstream pin (UPSTREAM.toml): which SGLang release the fork is built on, and its wheels.

The build takes the pinned upstream wheel for the running interpreter, from a local cache or
wheel directory when one holds a file with the pinned sha256, otherwise from the pinned URL,
and refuses any file whose sha256 differs from the pin.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

INDEX_URL = "https://pypi.org/simple"
CACHE_ENV = "SGLANG_GLM5MEGA_CACHE"  # where downloaded upstream wheels are kept
WHEEL_DIR_ENV = "SGLANG_GLM5MEGA_WHEEL_DIR"  # a local folder of upstream wheels (offline)
INDEX_ENV = "SGLANG_GLM5MEGA_INDEX_URL"  # a PEP 691 index other than PyPI


class PinError(RuntimeError):
    """The pin cannot be read, or no verified upstream wheel can be had for it."""


@dataclass(frozen=True)
class PinnedWheel:
    tag: str
    filename: str
    url: str
    sha256: str


@dataclass
class Pin:
    name: str
    version: str
    local: str
    wheels: list[PinnedWheel] = field(default_factory=list)

    @property
    def fork_version(self) -> str:
        return f"{self.version}+{self.local}"

    def wheel_for(self, tag: str) -> PinnedWheel:
        for wheel in self.wheels:
            if wheel.tag == tag:
                return wheel
        pinned = ", ".join(w.tag for w in self.wheels) or "none"
        raise PinError(
            f"no pinned {self.name} {self.version} wheel for this interpreter ({tag}); "
            f"pinned tags: {pinned}"
        )


def read_pin(path: Path) -> Pin:
    try:
        data = tomllib.loads(path.read_text())["upstream"]
        return Pin(
            name=data["name"],
            version=data["version"],
            local=data["local"],
            wheels=[PinnedWheel(**w) for w in data.get("wheels", [])],
        )
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
        raise PinError(f"cannot read the upstream pin {path.name}: {exc!r}") from exc


def render_pin(pin: Pin) -> str:
    lines = [
        "# The upstream SGLang release this fork is built on. Written by "
        "`python tools/patchtool rebase`;",
        "# `pip install .` downloads the wheel for the running interpreter and checks its "
        "sha256.",
        "",
        "[upstream]",
        f'name = "{pin.name}"',
        f'version = "{pin.version}"',
        f'local = "{pin.local}"',
        "",
    ]
    for w in sorted(pin.wheels, key=lambda w: w.tag):
        lines += [
            "[[upstream.wheels]]",
            f'tag = "{w.tag}"',
            f'filename = "{w.filename}"',
            f'url = "{w.url}"',
            f'sha256 = "{w.sha256}"',
            "",
        ]
    return "\n".join(lines)


def interpreter_tag() -> str:
    """The wheel tag upstream publishes for this interpreter (cpXY, manylinux_2_34, arch)."""
    if sys.implementation.name != "cpython" or sys.platform != "linux":
        raise PinError(
            f"upstream SGLang publishes Linux CPython wheels only; this is "
            f"{sys.implementation.name} on {sys.platform}"
        )
    libc, libc_version = platform.libc_ver()
    if libc == "glibc" and tuple(int(p) for p in libc_version.split(".")[:2]) < (2, 34):
        raise PinError(f"upstream wheels need glibc >= 2.34; this system has {libc_version}")
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{py}-{py}-manylinux_2_34_{platform.machine()}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "sglang-glm5mega" / "wheels"
    return Path(os.environ.get(CACHE_ENV) or default)


def fetch_wheel(wheel: PinnedWheel, log=print) -> Path:
    """A local, verified copy of the pinned wheel: cache, wheel dir, or download."""
    candidates = [cache_dir() / wheel.filename]
    if os.environ.get(WHEEL_DIR_ENV):
        candidates.insert(0, Path(os.environ[WHEEL_DIR_ENV]) / wheel.filename)
    for path in candidates:
        if path.is_file():
            got = sha256_of(path)
            if got == wheel.sha256:
                log(f"upstream wheel: {path.name} (local copy, sha256 verified)")
                return path
            raise PinError(
                f"hash mismatch for {path}: pinned sha256 {wheel.sha256}, file has {got}"
            )
    target = candidates[-1]
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"upstream wheel: downloading {wheel.url}")
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        try:
            with urllib.request.urlopen(wheel.url, timeout=120) as response:
                shutil.copyfileobj(response, tmp, 1 << 20)
        except OSError as exc:
            os.unlink(tmp.name)
            raise PinError(f"failed to download {wheel.url}: {exc}") from exc
    got = sha256_of(Path(tmp.name))
    if got != wheel.sha256:
        os.unlink(tmp.name)
        raise PinError(
            f"hash mismatch for {wheel.filename} from {wheel.url}: pinned sha256 "
            f"{wheel.sha256}, download has {got}"
        )
    os.replace(tmp.name, target)
    log(f"upstream wheel: {target.name} (downloaded, sha256 verified)")
    return target


def index_wheels(name: str, version: str) -> list[PinnedWheel]:
    """Every wheel the package index lists for name==version, with its sha256 (PEP 691)."""
    index = os.environ.get(INDEX_ENV, INDEX_URL).rstrip("/")
    request = urllib.request.Request(
        f"{index}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise PinError(f"cannot list {name} on {index}: {exc}") from exc
    prefix = f"{name}-{version}-"
    wheels = [
        PinnedWheel(
            tag=f["filename"][len(prefix) : -len(".whl")],
            filename=f["filename"],
            url=f["url"],
            sha256=f["hashes"]["sha256"],
        )
        for f in files
        if f["filename"].startswith(prefix) and f["filename"].endswith(".whl")
    ]
    if not wheels:
        raise PinError(f"{index} lists no wheel of {name} {version}")
    return wheels
