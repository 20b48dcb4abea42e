"""Fixtures shared by the CPU unit tests: a tiny GLM-5.3 model directory for upstream's
argument pipeline, and a CPU process that answers upstream's one GPU-capability query."""

import pytest

from model_dirs import write_model_dir


@pytest.fixture
def tiny_glm5_dir(tmp_path):
    return write_model_dir(tmp_path / "tiny-glm5")


@pytest.fixture
def hopper_capability(monkeypatch):
    """Upstream's DSA resolution asks the device capability; answer as an H200 would."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
