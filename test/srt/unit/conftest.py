"""Fixtures shared by the CPU unit tests: a tiny GLM-5.3 model directory for upstream's
argument pipeline, a CPU process that answers upstream's one GPU-capability query, and the
fused layer's recorded Triton launches that the compile tests compile for each target."""

import pytest

from compile_runs import record
from model_dirs import write_model_dir


@pytest.fixture
def tiny_glm5_dir(tmp_path):
    return write_model_dir(tmp_path / "tiny-glm5")


@pytest.fixture
def hopper_capability(monkeypatch):
    """Upstream's DSA resolution asks the device capability; answer as an H200 would."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))


@pytest.fixture(scope="session")
def tiny_launch_specs(tmp_path_factory):
    """Every distinct launch of the tiny-config fused layer (sm90_compile.py record)."""
    return record("record", tmp_path_factory.mktemp("tiny") / "specs.json")


@pytest.fixture(scope="session")
def real_stage_specs(tmp_path_factory):
    """The stage kernels' launches at one GLM-5.3 TP8 rank's shapes, 1-16 rows."""
    return record("record-real-stages", tmp_path_factory.mktemp("real") / "specs.json")
