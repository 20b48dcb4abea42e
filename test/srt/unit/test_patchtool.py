"""The patch tool: check passes, rebase carries shifted code 3-way and reports a planted
conflict by patch and file, refresh regenerates the series from a scratch tree."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools.forkbuild import pin as pinmod
from tools.forkbuild.series import load_series

REPO = Path(__file__).resolve().parents[3]


def patchtool(*args, repo=REPO, env=None):
    import os

    run_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, str(REPO / "tools/patchtool"), "--repo", str(repo), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=run_env,
    )


@pytest.fixture
def repo_copy(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "UPSTREAM.toml", copy)
    shutil.copytree(REPO / "patches", copy / "patches")
    return copy


@pytest.fixture
def upstream_tree(tmp_path):
    """The pinned upstream's files that the series touches, as a local upstream tree."""
    pin = pinmod.read_pin(REPO / "UPSTREAM.toml")
    wheel = pinmod.fetch_wheel(pin.wheel_for(pinmod.interpreter_tag()), log=lambda m: None)
    touched = {fp.old_path for p in load_series(REPO / "patches") for fp in p.files}
    root = tmp_path / "upstream" / "python"
    with zipfile.ZipFile(wheel) as z:
        for path in touched:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(z.read(path))
    return root


def test_check_passes_and_reports_each_patch():
    out = patchtool("check")
    assert out.returncode == 0, out.stdout + out.stderr
    for name in (REPO / "patches/series").read_text().split():
        assert f"{name}: applies with no fuzz" in out.stdout


def test_rebase_reports_a_planted_conflict_by_patch_and_file(repo_copy, upstream_tree):
    pipeline = upstream_tree / "sglang/srt/arg_groups/pipeline.py"
    pipeline.write_text(
        pipeline.read_text().replace(
            "    run_hook(handle_amd_monokernel, server_args)\n",
            "    run_hook(handle_amd_monokernel_v2, server_args)\n",
        )
    )
    before = {p.name: p.read_text() for p in (repo_copy / "patches").iterdir()}
    out = patchtool("rebase", "--to", "0.5.99", "--upstream-tree", str(upstream_tree.parent),
                    repo=repo_copy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "0003-fused-decode-resolution-hook.patch: CONFLICT in sglang/srt/arg_groups/pipeline.py"
        in out.stdout
    )
    assert "0001-fused-decode-backend-flag.patch: ok" in out.stdout
    assert {p.name: p.read_text() for p in (repo_copy / "patches").iterdir()} == before
    assert 'version = "0.5.23"' in (repo_copy / "UPSTREAM.toml").read_text()


def test_rebase_merges_moved_code_and_rewrites_patches_and_pin(repo_copy, upstream_tree):
    registry = upstream_tree / "sglang/srt/models/registry.py"
    registry.write_text("# a new upstream header line\n" * 3 + registry.read_text())
    out = patchtool(
        "rebase", "--to", "0.5.99", "--upstream-tree", str(upstream_tree), repo=repo_copy,
        env={pinmod.INDEX_ENV: "http://127.0.0.1:9/simple"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0002-resolve-glm5-architectures-to-fork-classes.patch: ok (merged 3-way)" in out.stdout
    assert "0001-fused-decode-backend-flag.patch: ok (applies as is)" in out.stdout
    assert "the pin keeps no wheels" in out.stdout
    rebased = (repo_copy / "patches/0002-resolve-glm5-architectures-to-fork-classes.patch")
    old = (REPO / "patches/0002-resolve-glm5-architectures-to-fork-classes.patch").read_text()
    assert rebased.read_text() != old and rebased.read_text().startswith("Subject: ")
    pin = pinmod.read_pin(repo_copy / "UPSTREAM.toml")
    assert pin.version == "0.5.99" and pin.wheels == []


def test_refresh_regenerates_the_series_from_a_scratch_tree(repo_copy, tmp_path):
    scratch = tmp_path / "scratch"
    assert patchtool("check", "--scratch", str(scratch), repo=repo_copy).returncode == 0
    for p in (repo_copy / "patches").iterdir():
        p.unlink()
    out = patchtool("refresh", "--scratch", str(scratch), repo=repo_copy)
    assert out.returncode == 0, out.stdout + out.stderr
    for p in (REPO / "patches").iterdir():
        assert (repo_copy / "patches" / p.name).read_text() == p.read_text(), p.name

    (scratch / "sglang/srt/models/registry.py").write_text("# edited, not committed\n")
    out = patchtool("refresh", "--scratch", str(scratch), repo=repo_copy)
    assert out.returncode == 1 and "uncommitted changes" in out.stdout
