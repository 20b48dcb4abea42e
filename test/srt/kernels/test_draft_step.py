"""The MTP draft's iteration on the GPU at real shapes of one TP8 rank: upstream's carried
top-k (physical KV slots, shuffled, int32) converted on the device by ``carry.TopkCarry``
into the draft layer's top-k buffer and attended with the indexer skipped, the conversion and
the layer captured as one CUDA graph (replayed bitwise equal to eager), a pad row among the
rows (``testing.carried_topk_checks``).

Run on the GPU machine: PYTHONPATH=python:sgl-kernel-ext python -m pytest test/srt/kernels -q
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the lent H200)", allow_module_level=True)

from sglang.srt.layers.fused_decode.layer import FusedLayer  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import glm53_config  # noqa: E402
from sglang.srt.layers.fused_decode.reference.weights import gen_layer  # noqa: E402
from sglang.srt.layers.fused_decode.testing import carried_topk_checks, make_case  # noqa: E402

CFG = glm53_config()
LID = next(i for i in range(CFG.num_hidden_layers) if CFG.is_moe(i) and CFG.runs_indexer(i))
_WEIGHTS = []


@pytest.mark.parametrize("contexts", [[3000, 2600, 0, 2100], [1500], [3000] * 16],
                         ids=["pad_row", "one_row_short", "16_rows"])
def test_draft_iteration_on_the_carried_topk_is_one_graph(contexts):
    if not _WEIGHTS:
        _WEIGHTS.append(gen_layer(CFG, 0, LID, tp_size=8, tp_rank=0, device="cuda"))
    case = make_case(CFG, LID, contexts, seed=len(contexts), device="cuda", lw=_WEIGHTS[0],
                     paged=True)
    layer = FusedLayer(CFG, case.lw, case.caches, len(contexts), case.batch.token_slots.shape[1])
    r = carried_topk_checks(case, layer, capture=True)
    assert all(r.values()), r
