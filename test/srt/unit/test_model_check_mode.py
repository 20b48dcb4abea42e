"""Check mode flags a fused layer whose outputs leave NUMERICS (a perturbed layer), names the
layer and the value, and leaves a faithful layer's step silent."""

import logging

import pytest
import torch

pytest.importorskip("sgl_kernel_ext.triton", reason="sgl-kernel-ext is not importable")

from sglang.srt.layers.fused_decode import check, runtime  # noqa: E402
from sglang.srt.layers.fused_decode.layer import FusedLayer  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import tiny_config  # noqa: E402
from sglang.srt.layers.fused_decode.testing import make_case  # noqa: E402

CFG = tiny_config()


class Perturbed:
    """A fused layer whose MLP output is off by 50 %."""

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, *args, **kw):
        y, res, topk = self.layer(*args, **kw)
        return y * 1.5, res, topk

    def routed_experts(self, m):
        return self.layer.routed_experts(m)


@pytest.mark.parametrize("perturb", [False, True], ids=["faithful", "perturbed"])
def test_checker_logs_values_outside_numerics(perturb, caplog):
    case = make_case(CFG, 1, [30, 12, 0], seed=3, tp_size=2)
    layer = FusedLayer(CFG, case.lw, case.caches, 4, case.batch.token_slots.shape[1])
    if perturb:
        layer = Perturbed(layer)
    checker = check.Checker(CFG, [case.lw], case.caches, "decode 3 rows")
    logger = logging.getLogger("sglang.srt.layers.fused_decode.check")
    logger.addHandler(caplog.handler)
    try:
        runtime.run_layers([layer], case.hidden, case.batch, lambda y: y,
                           lambda h, r: h, hook=checker)
    finally:
        logger.removeHandler(caplog.handler)
    if perturb:
        assert any(p.startswith("fused decode check: layer 1 (decode 3 rows): y_rel=")
                   for p in checker.problems), checker.problems
        assert "fused decode check: layer 1 (decode 3 rows): y_rel=" in caplog.text
    else:
        assert checker.problems == [], checker.errors


def test_write_slots_against_out_cache_loc(caplog):
    pool = torch.tensor([[0, 0, 0], [5, 6, 7], [8, 9, 10]], dtype=torch.int32)
    rows = runtime.StepRows(torch.tensor([2, 1, -1]), pool, torch.tensor([1, 2, 0]))
    assert check.check_write_slots(rows, torch.tensor([7, 9, 0]), "decode") == []
    (line,) = check.check_write_slots(rows, torch.tensor([7, 4, 0]), "decode")
    assert "row 1 (decode) writes slot 9, upstream's out_cache_loc is 4" in line
