"""Two TP ranks of the tiny GLM-5.3 as two processes on CPU (gloo), each running its shard's
fused layers under Triton's interpreter through ``runtime.run_layers`` with a real
all-reduce, against the reference over both shards:

- check mode on each rank, layer by layer (its reference's attention all-reduced by the same
  collective, the fused layer's discrete choices forced);
- the step's logits (each rank's vocab shard, gathered), as KL against the reference's;
- the same step with the attention's all-reduce left out (each layer norming its own part
  of the attention, the MLP still all-reduced), which the two checks must flag.

    python tp2_cpu_step.py OUT.json PORT
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
from glm5_cpu_model import _kl  # noqa: E402  (this folder's script: the logits KL)

WORLD = 2
LENGTHS = (21, 9, 30)  # prompt lengths; the step adds one token to each and a pad row


class WithoutAttentionReduce:
    """A fused layer whose attention part is left un-reduced (the defect the checks must
    catch): its MLP output is still all-reduced by run_layers."""

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, *args, reduce=None, **kw):
        return self.layer(*args, **kw)

    def routed_experts(self, m):
        return self.layer.routed_experts(m)


def rank_main(rank: int, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    from sglang.srt.layers.fused_decode import check, runtime
    from sglang.srt.layers.fused_decode.layer import FusedLayer
    from sglang.srt.layers.fused_decode.reference.batch import decode_batch
    from sglang.srt.layers.fused_decode.reference.cache import alloc_caches
    from sglang.srt.layers.fused_decode.reference.config import INDEX_PAGE_SIZE, tiny_config
    from sglang.srt.layers.fused_decode.reference.model import decode_step, prefill
    from sglang.srt.layers.fused_decode.reference.ops import add_rms_norm
    from sglang.srt.layers.fused_decode.reference.quant import bf16_linear
    from sglang.srt.layers.fused_decode.reference.weights import generate_weights
    from sglang.srt.layers.fused_decode.testing import clone_caches

    cfg = tiny_config()
    shards = [generate_weights(cfg, seed=0, tp_size=WORLD, tp_rank=r) for r in range(WORLD)]
    mine = shards[rank]
    ids = sorted(mine.layers)
    g = torch.Generator().manual_seed(5)  # the same on both ranks
    page = INDEX_PAGE_SIZE
    num_slots = -(-(sum(LENGTHS) + len(LENGTHS) + page) // page) * page
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    tables, start = [], 0
    for n in LENGTHS:
        tables.append(perm[start:start + n + 1])
        start += n + 1
    prompts = [torch.randint(2, cfg.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    caches = alloc_caches(cfg, num_slots, "cpu", layers=ids, poison=True)
    last = prefill(cfg, shards, prompts, [t[:-1] for t in tables], caches)
    input_ids = torch.tensor([int(lg[-1].argmax()) for lg in last] + [0])
    batch = decode_batch(list(LENGTHS) + [-1], tables + [tables[0]])
    valid = batch.positions >= 0
    ref = decode_step(cfg, shards, input_ids, batch, clone_caches(caches))

    calls = [0]

    def reduce(t):  # the TP group's all-reduce: fp32 sum of the bf16 parts, rounded once
        calls[0] += 1
        s = t.float()
        dist.all_reduce(s)
        return s.to(t.dtype)

    def final_norm(h, r):
        return add_rms_norm(h, r, mine.final_norm, cfg.rms_norm_eps, torch.bfloat16)[0]

    def step(drop_attention_reduce: bool):
        pool = clone_caches(caches)
        layers = [FusedLayer(cfg, mine.layers[i], pool, batch.num_rows, batch.token_slots.shape[1],
                             persistent_launch=False) for i in ids]
        if drop_attention_reduce:
            layers = [WithoutAttentionReduce(layer) for layer in layers]
        checker = check.Checker(cfg, [mine.layers[i] for i in ids], pool, "decode")
        hidden = mine.embed[input_ids.clamp_min(0)].to(torch.bfloat16)
        x = runtime.run_layers(layers, hidden, batch, reduce, final_norm, hook=checker)
        part = bf16_linear(x, mine.lm_head, torch.float32)
        gathered = [torch.empty_like(part) for _ in range(WORLD)]
        dist.all_gather(gathered, part)
        logits = torch.cat(gathered, dim=-1)
        return {"kl_max": _kl(logits[valid], ref[valid]), "check_problems": checker.problems,
                "check_errors": checker.errors}

    out = {"rank": rank, "step": step(False), "reduce_calls": calls[0]}
    out["without_attention_reduce"] = step(True)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def main(out_path: str, port: str) -> None:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(int(port), d), nprocs=WORLD, join=True)
        ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(WORLD)]
    Path(out_path).write_text(json.dumps({"ranks": ranks, "layers": 4}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
