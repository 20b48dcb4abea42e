"""Fixtures shared by the CPU unit tests: a tiny GLM-5.3 model directory for upstream's
argument pipeline, a CPU process that answers upstream's one GPU-capability query, and the
fused layer's recorded Triton launches that the compile tests compile for each target; and
the early start of the CPU model scripts of the selected modules (``cpu_script``)."""

import pytest

import cpu_script
from compile_runs import record
from model_dirs import write_model_dir


def pytest_collection_finish(session):
    """Start the CPU model scripts of the selected test modules (their CPU_SCRIPT) now."""
    for item in session.items:
        name = getattr(getattr(item, "module", None), "CPU_SCRIPT", None)
        if name:
            cpu_script.start(name)


def pytest_sessionfinish(session):
    cpu_script.stop_all()


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
