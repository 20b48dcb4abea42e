"""cluster_topk's host-side choices on CPU: which held sizes a wide table's kernel compiles,
that a bad HELD_SIZES is refused by name, and how many rows take the prefetching form (and
the rolled one, and two CTAs an SM) given the clusters the device holds."""

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
    # a held context's rows rolled at one CTA an SM, where the GPU holds the prefetching
    # form's clusters (an H100: 15), not past
    assert C.ROLL_ROWS <= C.PREFETCH_ROWS


def test_launch_form_follows_the_clusters_the_device_holds(monkeypatch):
    """The prefetching form (rolled) up to PREFETCH_ROWS rows of a wide table, no more than
    the device holds clusters of 8 at one CTA an SM; rolled without it up to ROLL_ROWS; two
    CTAs an SM where a rolled launch's clusters would not fit at one."""
    held = {(0, 8): 15, (1, 8): 10, (2, 8): 0}
    monkeypatch.setattr(C, "clusters_resident", lambda device, size: held[(device, size)])
    monkeypatch.setattr(C, "PREFETCH_ROWS", 15)
    monkeypatch.setattr(C, "ROLL_ROWS", 8)
    assert C.launch_form(1, True, 0) == (True, True, 1)
    assert C.launch_form(15, True, 0) == (True, True, 1)
    assert C.launch_form(16, True, 0) == (False, False, 1)
    assert C.launch_form(12, False, 0) == (False, False, 1)  # held whole: no prefetch, unrolled
    assert C.launch_form(8, False, 0) == (True, False, 1)
    assert C.launch_form(10, True, 1) == (True, True, 1)  # a GPU holding 10 clusters of 8
    assert C.launch_form(11, True, 1) == (False, False, 1)
    # the query failed, or no device named: PREFETCH_ROWS_UNQUERIED
    assert C.launch_form(8, True, 2) == C.launch_form(8, True) == (True, True, 1)
    assert C.launch_form(9, True, 2) == C.launch_form(9, True) == (False, False, 1)
    monkeypatch.setattr(C, "ROLL_ROWS", 15)  # held whole, rolled where the rows fit at one
    assert C.launch_form(12, False, 0) == (True, False, 1)
    assert C.launch_form(16, False, 0) == (False, False, 1)
    monkeypatch.setattr(C, "ROLL_ROWS", 16)  # rolled past what fits at one CTA an SM: two
    assert C.launch_form(16, True, 0) == (True, False, 2)
    assert C.launch_form(12, True, 1) == (True, False, 2)
    assert C.launch_form(12, False, 0) == (True, False, 1)
    monkeypatch.setattr(C, "PREFETCH", False)
    assert C.launch_form(4, True, 0) == (True, False, 1)
    monkeypatch.setattr(C, "ROLL", False)
    assert C.launch_form(4, True, 0) == (False, False, 1)


def test_cluster_size_follows_the_table_and_rows(monkeypatch):
    assert C.WIDE_CLUSTER == 16  # a wide table's rows, at few rows
    assert C.cluster_size(1, 65536) == 8  # held whole by 8 CTAs: no wide table
    assert C.cluster_size(1, 1 << 20) == 16
    assert C.cluster_size(C.WIDE_CLUSTER_ROWS, 1 << 20) == 16
    assert C.cluster_size(C.WIDE_CLUSTER_ROWS + 1, 1 << 20) == 8
    assert C.keys_per_thread(131072, 16) == (32, False)
    assert C.keys_per_thread(1 << 20, 16) == (32, True)
    assert C.ClusterTopk(2048, 32, wide=True, cluster=16).width == 131072
    monkeypatch.setattr(C, "WIDE_CLUSTER", 8)
    assert C.cluster_size(1, 1 << 20) == 8


def test_cluster_size_asks_the_device_how_many_it_holds(monkeypatch):
    """16 CTAs a row only where the GPU holds as many clusters of 16 as there are rows (a
    non-portable size; the query's answer, 0 where it fails)."""
    held = {}
    monkeypatch.setattr(C, "clusters_resident", lambda device, size: held[(device, size)])
    held[(0, 16)] = 3
    assert C.cluster_size(3, 1 << 20, 0) == 16
    assert C.cluster_size(4, 1 << 20, 0) == 8
    held[(0, 16)] = 0
    assert C.cluster_size(1, 1 << 20, 0) == 8
    assert C.cluster_size(1, 1 << 20) == 16  # no device named: not asked


def test_a_failed_occupancy_query_means_none(monkeypatch, caplog):
    import cutlass.utils

    class Broken:
        def __init__(self, device):
            raise RuntimeError("no current context")

    monkeypatch.setattr(cutlass.utils, "HardwareInfo", Broken)
    C.clusters_resident.cache_clear()
    try:
        assert C.clusters_resident(0, 16) == 0
        assert "occupancy query" in caplog.text and "no current context" in caplog.text
    finally:
        C.clusters_resident.cache_clear()


@pytest.mark.parametrize("bad", [4, 12, 32])
def test_bad_cluster_sizes_are_refused(bad, monkeypatch):
    monkeypatch.setattr(C, "WIDE_CLUSTER", bad)
    with pytest.raises(ValueError, match="WIDE_CLUSTER"):
        C.cluster_size(1, 1 << 20)
    with pytest.raises(ValueError, match="CTAs a row"):
        C.ClusterTopk(2048, 32, wide=True, cluster=bad)


def test_digit_bits_unrolled_and_rolled_agree():
    """A pass's digit shift and the mask of the digits above it, as the unrolled passes take
    them (ints, no mask at pass 0) and as the rolled loop computes them (-256 << shift)."""
    for p in range(4):
        shift, high = C._digit_bits(p)
        assert shift == 24 - 8 * p
        rolled = ((-256 << shift) + (1 << 31)) % (1 << 32) - (1 << 31)  # int32 wrap
        assert rolled == (0 if high is None else high)


def test_prepare_asks_the_layers_device_once_at_build(monkeypatch):
    """A layer's build asks the driver how many clusters of 8 and of 16 CTAs its device holds
    (outside any graph capture); with 8 CTAs a row, of 8 alone."""
    import contextlib

    import torch

    asked = []
    monkeypatch.setattr(C, "clusters_resident", lambda device, size: asked.append((device, size)))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    C.prepare(torch.device("cuda", 3))
    assert asked == [(3, 8), (3, 16)]
    monkeypatch.setattr(C, "WIDE_CLUSTER", 8)
    C.prepare(torch.device("cuda", 3))
    assert asked == [(3, 8), (3, 16), (3, 8)]
