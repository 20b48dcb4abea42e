"""Run the fused layer once per layer kind at the tiny config on the GPU, for
compute-sanitizer (memcheck, racecheck): small shapes, a pad row, contexts past the top-k;
then two rows (the last-arrival tails of router+route and gate/up+SwiGLU run at 1-2 rows)
with one context past the split top-k's threshold; then one row (the GEMV forms of the MoE,
the bf16 GEMVs and absorb). An optional argument runs absorb_v in
that many latent chunks (mla.ABSORB_V_SPLIT_C, its last-arrival sum; default 4); a second,
"merge", has those programs merge the attention's chunks at every row count (by default only
at one row: mla.ABSORB_V_MERGE_MAX_ROWS); "vo" runs absorb_v and o_proj as one launch
(attn_out.MAX_ROWS) at every row count; "slot_wait" adds six rows (down waits per slot on
gate/up's counters from moe.DOWN_SLOT_WAIT_FROM_ROWS rows, the four-row case's too).

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 test/srt/kernels/sanitize_fused_layer.py
"""

import sys

import torch

from sgl_kernel_ext.triton import attn_out, mla, topk

from sglang.srt.layers.fused_decode.layer import FusedLayer
from sglang.srt.layers.fused_decode.reference.config import tiny_config
from sglang.srt.layers.fused_decode.testing import make_case


def main(absorb_v_split: int = mla.ABSORB_V_SPLIT_C, merge: bool = False, vo: bool = False,
         slot_wait: bool = False):
    mla.ABSORB_V_SPLIT_C = absorb_v_split
    if merge:
        mla.ABSORB_V_MERGE_MAX_ROWS = 16
    if vo:
        attn_out.MAX_ROWS = 16
    cfg = tiny_config()
    contexts = ([30, 0, 12, 40], [topk.SPLIT_MIN_WIDTH + 100, 40], [300])
    if slot_wait:
        contexts += ([30, 0, 12, 40, 7, 21],)
    for ctx in contexts:
        for layer_id in (0, 1, 2):  # dense+indexer, MoE+indexer, MoE reusing the top-k
            case = make_case(cfg, layer_id, ctx, seed=layer_id, tp_size=2, device="cuda")
            layer = FusedLayer(cfg, case.lw, case.caches, len(ctx), case.batch.token_slots.shape[1])
            y, _, _ = layer(case.hidden, case.residual, case.batch, case.topk_prev)
            torch.cuda.synchronize()
            assert not torch.isnan(y[case.batch.valid]).any()
            assert not layer.health(), layer.health()
            print(f"layer {layer_id}, contexts {ctx}: ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else mla.ABSORB_V_SPLIT_C, "merge" in sys.argv[2:],
         "vo" in sys.argv[2:], "slot_wait" in sys.argv[2:])
