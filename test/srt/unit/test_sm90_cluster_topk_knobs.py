"""cluster_topk's host-side choices on CPU: which held sizes a wide table's kernel compiles,
that a bad HELD_SIZES is refused by name, and how many rows take the prefetching form."""

import pytest

pytest.importorskip("cutlass.cute", reason="CuTe DSL (nvidia-cutlass-dsl) is not installed")

from sgl_kernel_ext.nvidia.sm90 import cluster_topk as C  # noqa: E402


def test_held_sizes_follow_the_knobs(monkeypatch):
    monkeypatch.setattr(C, "SIZED", True)
    assert C.held_sizes() == (4, 8, 16)
    monkeypatch.setattr(C, "HELD_SIZES", (8, 4, 8))
    assert C.held_sizes() == (4, 8)
    monkeypatch.setattr(C, "SIZED", False)
    assert C.held_sizes() == ()


@pytest.mark.parametrize("bad", [(6,), (0,), (64,)])
def test_bad_held_sizes_are_refused(bad, monkeypatch):
    monkeypatch.setattr(C, "SIZED", True)
    monkeypatch.setattr(C, "HELD_SIZES", bad)
    with pytest.raises(ValueError, match="HELD_SIZES"):
        C.held_sizes()


def test_a_kernel_holds_its_sizes_below_kpt_then_kpt():
    assert C.ClusterTopk(2048, 32, wide=True).held_sizes() == (32,)  # SIZED's default: off
    assert C.ClusterTopk(2048, 32, wide=True, sizes=C.HELD_SIZES).held_sizes() == (4, 8, 16, 32)
    assert C.ClusterTopk(2048, 8, sizes=(4, 8, 16)).held_sizes() == (4, 8)
    assert C.ClusterTopk(2048, 32, sizes=()).held_sizes() == (32,)


def test_wide_tables_and_prefetch_rows():
    assert C.keys_per_thread(8192) == (4, False)
    assert C.keys_per_thread(65536) == (32, False)
    assert C.keys_per_thread(1 << 20) == (32, True)
    assert 1 <= C.PREFETCH_ROWS < 16  # 16 rows' clusters took two waves on an H100
