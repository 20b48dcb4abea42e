"""sm90 sparse_mla's host checks, on CPU: the shapes the layer passes are accepted up to the
launch, and each wrong argument is refused with a message naming it (before anything is
compiled or launched)."""

import pytest
import torch

pytest.importorskip("cutlass.cute", reason="CuTe DSL (nvidia-cutlass-dsl) is not installed")

from sgl_kernel_ext.nvidia.sm90 import sparse_mla  # noqa: E402

M, S, K = 3, 4, 2048


def _args(**over):
    a = dict(qcat=torch.zeros(M, 8, 576, dtype=torch.bfloat16),
             kv_cache=torch.zeros(64, 576, dtype=torch.bfloat16),
             topk=torch.zeros(M, K, dtype=torch.int64),
             token_slots=torch.zeros(M, 100, dtype=torch.int32), sm_scale=0.1,
             part_o=torch.zeros(M, S, 8, 512), part_ml=torch.zeros(M, S, 8, 2))
    a.update(over)
    return a


WRONG = {
    "8 heads a rank": dict(qcat=torch.zeros(M, 16, 576, dtype=torch.bfloat16)),
    "512\\+64-wide rows, got q 512": dict(qcat=torch.zeros(M, 8, 512, dtype=torch.bfloat16)),
    "and cache 512": dict(kv_cache=torch.zeros(64, 512, dtype=torch.bfloat16)),
    "top-k widths a multiple of 64": dict(topk=torch.zeros(M, 2000, dtype=torch.int64)),
    "33 chunks of 32 blocks": dict(part_o=torch.zeros(M, 33, 8, 512),
                                   part_ml=torch.zeros(M, 33, 8, 2)),
    "qcat must be a contiguous torch.bfloat16": dict(qcat=torch.zeros(M, 8, 576)),
    "part_ml must be a contiguous": dict(part_ml=torch.zeros(M, S, 8, 2, dtype=torch.float64)),
    "part_o \\(3, 4, 8, 256\\)": dict(part_o=torch.zeros(M, S, 8, 256)),
    "topk must be int32/int64": dict(topk=torch.zeros(M, K, dtype=torch.float32)),
    "token_slots must be a row-major": dict(token_slots=torch.zeros(100, M, dtype=torch.int32).T),
    "slot_rows must be int64": dict(slot_rows=torch.zeros(M, dtype=torch.int32)),
    "2 or 3 stages": dict(stages=4),
    "no ablation 'no_pv'": dict(ablate="no_pv"),
    "1 or 2 gathering warpgroups, not 3": dict(gatherers=3),
}


@pytest.mark.parametrize("why", sorted(WRONG))
def test_refuses_naming_the_argument(why):
    with pytest.raises(ValueError, match=why):
        sparse_mla.sparse_attention(**_args(**WRONG[why]))


def test_layer_shapes_pass_the_checks(monkeypatch):
    """The layer's shapes reach the compile (stubbed here: a CPU machine cannot launch), as
    the forms they ask for (stages 0 is the module's STAGES, 2)."""
    seen = []

    def stop(*key):
        seen.append(key)
        raise RuntimeError("compile reached")

    monkeypatch.setattr(sparse_mla, "_compiled", stop)
    for form in (dict(stages=2), dict(stages=3, ablate="no_mma"),
                 dict(slot_rows=torch.zeros(M, dtype=torch.int64))):
        with pytest.raises(RuntimeError, match="compile reached"):
            sparse_mla.sparse_attention(**_args(**form))
    assert seen == [(False, False, 32, 64, 2, "", 1),
                    (False, False, 32, 64, 3, "no_mma", 1),
                    (False, True, 32, 64, 2, "", 1)]
