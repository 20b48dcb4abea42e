"""The fork build: the series applies to the pinned upstream, and every failure stops the
build with an error naming what failed (download, hash, patch/file/hunk, overlay clash)."""

import shutil
import zipfile
from pathlib import Path

import pytest

from tools.forkbuild import pin as pinmod
from tools.forkbuild.series import HEADER_FIELDS, header_fields, load_series
from tools.forkbuild.unidiff import PatchError
from tools.forkbuild.wheel import BuildError, build_fork_wheel

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pinned_wheel():
    pin = pinmod.read_pin(REPO / "UPSTREAM.toml")
    return pinmod.fetch_wheel(pin.wheel_for(pinmod.interpreter_tag()), log=lambda m: None)


def _repo_copy(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for part in ("UPSTREAM.toml", "patches", "python", "sgl-kernel-ext"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, copy / part)
    return copy


def test_pin_covers_cp311_and_cp312_x86_64():
    pin = pinmod.read_pin(REPO / "UPSTREAM.toml")
    assert pin.version == "0.5.23"
    tags = {w.tag for w in pin.wheels}
    assert {"cp311-cp311-manylinux_2_34_x86_64", "cp312-cp312-manylinux_2_34_x86_64"} <= tags
    assert all(len(w.sha256) == 64 and w.url.endswith(w.filename) for w in pin.wheels)


def test_every_patch_has_its_header_and_touches_what_it_says():
    patches = load_series(REPO / "patches")
    assert patches
    for patch in patches:
        fields = header_fields(patch)
        assert set(HEADER_FIELDS) <= set(fields)
        for fp in patch.files:
            assert fp.path in fields["Touches"], (patch.name, fp.path)


def test_series_applies_with_no_fuzz_to_pinned_upstream(pinned_wheel):
    from tools.forkbuild.series import apply_series

    with zipfile.ZipFile(pinned_wheel) as z:
        names = set(z.namelist())
        changed, reports = apply_series(
            load_series(REPO / "patches"),
            lambda p: z.read(p).decode() if p in names else None,
        )
    assert [r.name for r in reports] == (REPO / "patches/series").read_text().split()
    assert all(text is not None for text in changed.values())


def test_broken_hunk_stops_the_build_naming_patch_file_hunk(tmp_path, pinned_wheel):
    repo = _repo_copy(tmp_path)
    target = repo / "patches/0003-fused-decode-resolution-hook.patch"
    text = target.read_text().replace(" run_hook(handle_amd_mono", " run_hook(handle_amd_monoX")
    target.write_text(text)
    with pytest.raises(PatchError) as err:
        build_fork_wheel(repo, tmp_path / "out", log=lambda m: None)
    assert err.value.patch == "0003-fused-decode-resolution-hook.patch"
    assert err.value.file == "sglang/srt/arg_groups/pipeline.py" and err.value.hunk == 1
    assert not (tmp_path / "out").exists()


def test_hash_mismatch_is_refused(tmp_path, monkeypatch):
    pin = pinmod.read_pin(REPO / "UPSTREAM.toml")
    wheel = pin.wheel_for(pinmod.interpreter_tag())
    (tmp_path / wheel.filename).write_bytes(b"not the upstream wheel")
    monkeypatch.setenv(pinmod.WHEEL_DIR_ENV, str(tmp_path))
    with pytest.raises(pinmod.PinError, match="hash mismatch"):
        pinmod.fetch_wheel(wheel, log=lambda m: None)


def test_failed_download_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(pinmod.CACHE_ENV, str(tmp_path))
    wheel = pinmod.PinnedWheel("t", "x.whl", "http://127.0.0.1:9/x.whl", "0" * 64)
    with pytest.raises(pinmod.PinError, match="failed to download http://127.0.0.1:9/x.whl"):
        pinmod.fetch_wheel(wheel, log=lambda m: None)
    assert not any(tmp_path.iterdir())


def test_unpinned_interpreter_is_refused():
    pin = pinmod.read_pin(REPO / "UPSTREAM.toml")
    with pytest.raises(pinmod.PinError, match="no pinned sglang 0.5.23 wheel for this interpreter"):
        pin.wheel_for("cp39-cp39-manylinux_2_34_x86_64")


def test_overlay_may_not_replace_upstream_files(tmp_path, pinned_wheel):
    repo = _repo_copy(tmp_path)
    clash = repo / "python/sglang/srt/models/registry.py"
    clash.write_text("# would shadow upstream\n")
    with pytest.raises(BuildError, match="registry.py"):
        build_fork_wheel(repo, tmp_path / "out", log=lambda m: None)
