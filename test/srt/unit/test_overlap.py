"""The stage kernels' overlap policy (sgl_kernel_ext.triton.overlap), on CPU: never under the
interpreter, only up to MAX_ROWS rows (WIDE_MAX_ROWS inside ``wide()``), off through the
environment, and step_rows nests; the prefetch switched off by kernel name."""

import pytest

from sgl_kernel_ext.triton import overlap


def test_off_under_the_interpreter_and_launches_plain():
    assert not overlap.enabled()  # test/conftest.py runs kernels under the interpreter here
    assert overlap.launch_kw() == {}


def test_rows_bound_and_environment(monkeypatch):
    monkeypatch.setattr(overlap, "supported", lambda: True)
    assert overlap.enabled()
    with overlap.step_rows(overlap.MAX_ROWS):
        assert overlap.enabled() and overlap.launch_kw() == {"launch_pdl": True}
        with overlap.step_rows(overlap.MAX_ROWS + 1):
            assert not overlap.enabled() and overlap.launch_kw() == {}
        assert overlap.enabled()
    monkeypatch.setenv(overlap.ENV, "0")
    assert not overlap.enabled()


def test_wide_kernels_have_their_own_rows_bound(monkeypatch):
    monkeypatch.setattr(overlap, "supported", lambda: True)
    monkeypatch.setattr(overlap, "MAX_ROWS", 16)
    monkeypatch.setattr(overlap, "WIDE_MAX_ROWS", 8)
    with overlap.step_rows(16):
        assert overlap.enabled()
        with overlap.wide():
            assert not overlap.enabled() and overlap.launch_kw() == {}
            with overlap.step_rows(8):
                assert overlap.enabled()
        assert overlap.enabled()


def test_each_expert_kernel_can_have_its_own_bound(monkeypatch):
    monkeypatch.setattr(overlap, "supported", lambda: True)
    monkeypatch.setattr(overlap, "WIDE_MAX_ROWS", 2)
    monkeypatch.setattr(overlap, "WIDE_KERNEL_MAX_ROWS", {"sum": 16})
    seen = {}

    def launcher(name):
        @overlap.wide_launcher(name)
        def launch():
            seen[name] = overlap.enabled()
        return launch

    with overlap.step_rows(16):
        launcher("gate_up")()
        launcher("sum")()
        assert seen == {"gate_up": True, "sum": True}  # outside wide(): the narrow bound
        with overlap.wide():
            launcher("gate_up")()
            launcher("sum")()
            assert seen == {"gate_up": False, "sum": True}
            assert not overlap.enabled()  # the name is restored on return


def test_moe_expert_launchers_are_named_for_their_bounds():
    from sgl_kernel_ext.triton import moe

    for fn in (moe.gate_up, moe.down, moe.sum_terms):
        assert hasattr(fn, "__wrapped__"), f"{fn.__name__} launches without wide_launcher"


def test_prefetch_off_by_kernel_name_and_unknown_names_refused(monkeypatch):
    from benchmark import tiling_probe

    assert tiling_probe.PREFETCH_KERNELS == overlap.PREFETCH_KERNELS
    assert tiling_probe.PREFETCH_OFF == overlap.PREFETCH_OFF
    assert "fp8_linear_prefetch" in tiling_probe.VARIANTS
    for variant in tiling_probe.VARIANTS.values():
        off = variant.get(("overlap", "PREFETCH_OFF"), frozenset())
        assert off <= set(overlap.PREFETCH_KERNELS), off
    assert not overlap.prefetches("down") and overlap.prefetches("router")
    monkeypatch.setattr(overlap, "PREFETCH_OFF", frozenset({"router"}))
    assert overlap.prefetches("down") and not overlap.prefetches("router")
    with pytest.raises(ValueError, match="no stage kernel named 'o_proj'"):
        overlap.prefetches("o_proj")
    monkeypatch.setattr(overlap, "PREFETCH_OFF", frozenset({"absorbv"}))
    with pytest.raises(ValueError, match="absorbv"):
        overlap.prefetches("absorb")


@pytest.mark.parametrize("env, expected", [(None, ["0", "16", "True", "True"]),
                                           ("0", ["0", "0", "False", "False"]),
                                           ("1", ["16", "16", "True", "True"]),
                                           ("yes", None)])
def test_weights_early_env_sets_the_four_forms(env, expected):
    """SGL_KERNEL_EXT_WEIGHTS_EARLY: unset, the defaults of the forms that load what their
    predecessors do not write before the wait (the norm's off, the rest on); "1" / "0" all on
    / off; anything else refused, naming the variable."""
    import os
    import subprocess
    import sys

    code = ("from sgl_kernel_ext.triton import indexer, mla, moe, norm; "
            "print(norm.W_EARLY_MAX_ROWS, mla.LATENT_W_EARLY_MAX_ROWS, "
            "moe.ROUTE_CONSTS_EARLY, indexer.PREPARE_EARLY)")
    environ = {k: v for k, v in os.environ.items() if k != overlap.WEIGHTS_EARLY_ENV}
    if env is not None:
        environ[overlap.WEIGHTS_EARLY_ENV] = env
    environ["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True)
    if expected is None:
        assert done.returncode != 0
        assert f"{overlap.WEIGHTS_EARLY_ENV}='yes': expected 1 (on) or 0 (off)" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == expected
