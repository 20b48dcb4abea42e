"""decode_step's refusal (CPU): a step whose weights cannot fit the GPU's free memory exits
naming the sizes and the way out before copying anything, and one that fits goes on."""

from types import SimpleNamespace

import pytest
import torch

from benchmark import decode_step


def _check(free_bytes, monkeypatch, layers=10):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (free_bytes, 80e9))
    cfg = SimpleNamespace(vocab_size=8 * 1000, hidden_size=1000)  # an LM head shard of 2 MB
    bases = {"dense": {"w": torch.empty(250_000_000, dtype=torch.int8)},  # 0.25 GB
             "moe": {"w": torch.empty(1_000_000_000, dtype=torch.int8), "s": torch.empty(10)}}
    kinds = ["dense"] * 2 + ["moe"] * (layers - 2)
    decode_step._refuse_unless_it_fits(bases, kinds, cfg, 8, "cpu")


def test_a_step_too_large_for_the_gpu_is_refused_with_its_sizes(monkeypatch):
    # 8 copies (one dense of 0.25 GB, seven MoE of 1.0) and the head: ~7.25 GB, 10 GB free
    with pytest.raises(SystemExit, match=r"need 7 GB more weights, this GPU has 10 GB free.*"
                                         r"--layers N"):
        _check(10e9, monkeypatch)


def test_a_step_that_fits_goes_on(monkeypatch):
    _check(13.3e9, monkeypatch)  # 7.25 GB of copies + 6 GB to spare
