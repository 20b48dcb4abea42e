"""Run the fused layer once per layer kind at the tiny config on the GPU, for
compute-sanitizer (memcheck, racecheck): small shapes, a pad row, contexts past the top-k.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 test/srt/kernels/sanitize_fused_layer.py
"""

import torch

from sglang.srt.layers.fused_decode.layer import FusedLayer
from sglang.srt.layers.fused_decode.reference.config import tiny_config
from sglang.srt.layers.fused_decode.testing import make_case


def main():
    cfg = tiny_config()
    for layer_id in (0, 1, 2):  # dense+indexer, MoE+indexer, MoE reusing the top-k
        case = make_case(cfg, layer_id, [30, 0, 12, 40], seed=layer_id, tp_size=2, device="cuda")
        layer = FusedLayer(cfg, case.lw, case.caches, 4, case.batch.token_slots.shape[1])
        y, _, _ = layer(case.hidden, case.residual, case.batch, case.topk_prev)
        torch.cuda.synchronize()
        assert not torch.isnan(y[case.batch.valid]).any()
        print(f"layer {layer_id}: ok")


if __name__ == "__main__":
    main()
