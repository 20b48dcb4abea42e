"""decode_step's weight sets (CPU): a step whose layers all fit the GPU's free memory gets a
set a layer; one that does not shares sets between far layers (the largest cap that fits,
at least MIN_SETS) or, asked for a set a layer, exits naming the sizes and the way out before
copying anything; the layers read their kind's sets in turn."""

from types import SimpleNamespace

import pytest
import torch

from benchmark import decode_step

GB = 1e9


def _plan(free_bytes, monkeypatch, mode="fit", layers=10):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (free_bytes, 80e9))
    cfg = SimpleNamespace(vocab_size=8 * 1000, hidden_size=1000)  # an LM head shard of 2 MB
    bases = {"dense": {"w": torch.empty(250_000_000, dtype=torch.int8)},  # 0.25 GB
             "moe": {"w": torch.empty(1_000_000_000, dtype=torch.int8), "s": torch.empty(10)}}
    kinds = ["dense"] * 2 + ["moe"] * (layers - 2)
    return decode_step.plan_weight_sets(bases, kinds, cfg, 8, "cpu", mode)


def test_a_step_that_fits_gets_a_set_a_layer(monkeypatch):
    # 8 copies (one dense of 0.25 GB, seven MoE of 1.0) and the head: ~7.25 GB + 6 to spare
    assert _plan(13.3 * GB, monkeypatch) == {"dense": 2, "moe": 8}
    assert _plan(13.3 * GB, monkeypatch, "all") == {"dense": 2, "moe": 8}


def test_a_step_too_large_shares_the_fewest_sets_that_fit(monkeypatch):
    # 6 MoE sets: 0.25 + 5 * 1.0 + head = 5.25 GB + 6 spare = 11.25; 7 sets need 12.25
    assert _plan(12.0 * GB, monkeypatch) == {"dense": 2, "moe": 6}
    assert _plan(12.0 * GB, monkeypatch, "5") == {"dense": 2, "moe": 5}


def test_a_set_a_layer_too_large_is_refused_with_its_sizes(monkeypatch):
    with pytest.raises(SystemExit, match=r"10 layers and the LM head need 7 GB more weights, "
                                         r"this GPU has 10 GB free.*--layers N.*--weight-sets fit"):
        _plan(10 * GB, monkeypatch, "all")


def test_fewer_than_min_sets_is_refused(monkeypatch):
    # MIN_SETS (4) MoE sets need 3.25 GB + 6 spare
    assert decode_step.MIN_SETS == 4
    assert _plan(9.3 * GB, monkeypatch) == {"dense": 2, "moe": 4}
    with pytest.raises(SystemExit, match=r"4 weight sets a kind and the LM head need 3 GB"):
        _plan(9.0 * GB, monkeypatch)
    with pytest.raises(SystemExit, match=r"--weight-sets takes fit, all or a count"):
        _plan(20 * GB, monkeypatch, "some")


def test_layers_read_their_kinds_sets_in_turn():
    kinds = ["dense", "moe", "moe", "dense", "moe", "moe", "moe"]
    picks = [decode_step.set_of(kinds, lid, {"dense": 2, "moe": 2}) for lid in range(len(kinds))]
    assert picks == [0, 0, 1, 1, 0, 1, 0]
