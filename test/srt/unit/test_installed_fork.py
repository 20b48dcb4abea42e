"""The installed ``sglang`` is this checkout's fork: version, provenance, every overlay file,
every patched hunk, and the extension as a dependency."""

import importlib.metadata as md
import json
import sys
from pathlib import Path

import pytest

from tools.forkbuild.pin import read_pin
from tools.forkbuild.series import load_series
from tools.forkbuild.wheel import overlay_files

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def dist():
    try:
        return md.distribution("sglang")
    except md.PackageNotFoundError:
        pytest.skip("sglang is not installed (install the fork: pip install .)")


def _installed(dist, path):
    return Path(dist.locate_file(path))


def test_version_is_the_pinned_upstream_plus_fork_label(dist):
    assert dist.version == read_pin(REPO / "UPSTREAM.toml").fork_version


def test_provenance_lists_the_series(dist):
    fork = json.loads(dist.read_text("FORK.json"))
    assert [p["name"] for p in fork["patches"]] == (REPO / "patches/series").read_text().split()
    assert fork["upstream"]["version"] == read_pin(REPO / "UPSTREAM.toml").version


def test_every_overlay_file_is_installed_as_in_the_checkout(dist):
    overlay = overlay_files(REPO)
    assert "sglang/srt/models/glm5_mega/hooks.py" in overlay
    stale = [p for p, data in overlay.items() if not _installed(dist, p).is_file()
             or _installed(dist, p).read_bytes() != data]
    assert not stale, f"reinstall the fork (pip install .): differs from the checkout: {stale}"


def test_every_patched_hunk_is_in_the_installed_files(dist):
    for patch in load_series(REPO / "patches"):
        for fp in patch.files:
            text = _installed(dist, fp.path).read_text()
            for number, hunk in enumerate(fp.hunks, start=1):
                assert "".join(hunk.new()) in text, (patch.name, fp.path, number)


def test_installed_extension_is_the_checkouts(dist):
    """The installed sgl_kernel_ext holds exactly the checkout's sources (a stale extension
    would hide behind the tests, which import the checkout's)."""
    # the installed one, not the build metadata a build leaves in the checkout (on sys.path)
    sources = {REPO, REPO / "sgl-kernel-ext", REPO / "python"}
    site = [p for p in sys.path if Path(p or ".").resolve() not in sources]
    found = [d for d in md.distributions(path=site) if d.metadata["Name"] == "sgl-kernel-ext"]
    assert found, "sgl-kernel-ext is not installed (install the fork: pip install .)"
    ext = found[0]
    src = REPO / "sgl-kernel-ext"
    direct = json.loads(ext.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):  # installed as the checkout itself
        assert Path(direct["url"].removeprefix("file://")).resolve() == src.resolve()
        return
    for path in sorted((src / "sgl_kernel_ext").rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        installed = Path(ext.locate_file(rel))
        assert installed.is_file() and installed.read_bytes() == path.read_bytes(), (
            f"installed sgl-kernel-ext differs from the checkout at {rel}: reinstall the fork")


def test_fork_requires_the_extension_and_it_is_installed(dist):
    requirements = dist.requires or []
    assert any(r.startswith("sgl-kernel-ext") for r in requirements)
    assert md.version("sgl-kernel-ext") == "0.1.0"
    assert any(r.startswith("torch") for r in requirements), "upstream's dependencies kept"
