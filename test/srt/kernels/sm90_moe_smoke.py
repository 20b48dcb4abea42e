"""fp8_moe's gate/up then down, then both as one launch (``experts``), in one process (a
fault ends the CUDA context, and with it every later test's):
`python3 test/srt/kernels/sm90_moe_smoke.py M [GRID [EXPERTS TOPK]]` on one TP8 rank's MoE
shapes (GRID CTAs: fewer than the multiprocessors give each more units); prints each kernel's
completion, gate/up's check (test_sm90_moe's) and whether the one launch's terms are the two
launches', or the error. Small enough for compute-sanitizer."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sm90_moe import Moe, _check_act, fp8_moe  # noqa: E402

m = int(sys.argv[1])
grid = int(sys.argv[2]) if len(sys.argv) > 2 else 0
experts, topk = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (256, 8)
moe = Moe(m, experts, 256, 6144, topk, seed=m)
parts, arrivals, act_q, act_s = moe.buffers()
if grid:  # the partials' rows for this grid's split
    parts = torch.full((moe.slots_max * 48, m, 512), float("nan"), device="cuda")
moe.gate_up(parts, arrivals, act_q, act_s, pdl=True, grid=grid)
torch.cuda.synchronize()
print(f"m={m} grid={grid} experts={experts} slots={moe.n}: gate_up ran", flush=True)
terms = torch.full((m, topk + 1, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")
moe.down_into(act_q, act_s, terms, pdl=True, grid=grid)
torch.cuda.synchronize()
print(f"m={m}: down ran, unwritten terms {int(terms.isnan().sum())}", flush=True)
_check_act(moe, act_q, act_s)
print(f"m={m}: gate_up's activations within bounds", flush=True)
fused = torch.full_like(terms, float("nan"))
flags = torch.zeros(fp8_moe.flags_size(moe.slots_max, 256), dtype=torch.int32, device="cuda")
act_q2, act_s2 = torch.empty_like(act_q), torch.empty_like(act_s)
fp8_moe.experts(moe.padded_x(), moe.sx, moe.gate, moe.gate_s, moe.up, moe.up_s, moe.down,
                moe.down_s, moe.sh_gate, moe.sh_gate_s, moe.sh_up, moe.sh_up_s, moe.sh_down,
                moe.sh_down_s, moe.slot_expert, moe.num_slots, moe.slot_weight, moe.slot_rank,
                parts, arrivals, flags, act_q2, act_s2, fused, pdl=True, grid=grid)
torch.cuda.synchronize()
print(f"m={m}: experts (one launch) ran, terms equal to the two launches': "
      f"{torch.equal(fused.view(torch.int16), terms.view(torch.int16))}, flags "
      f"{flags.tolist()[-2:]} (all zero: {int(flags.abs().sum()) == 0})", flush=True)
