"""Time a TP layer boundary on the GPUs of one host: the all-reduce of each rank's rows and the
residual add + RMSNorm after it (GLM-5.3's 6144 columns, bf16 and FP8 out), three ways in
the same run:

- ``peer_norm``: ``sgl_kernel_ext.triton.peer_norm``, both in one launch;
- ``symm_mem``: torch's symmetric-memory one-shot all-reduce, then ``norm.add_rms_norm``;
- ``nccl``: NCCL's all-reduce, then the norm.

Each arm is a CUDA graph of --copies boundaries back to back (each on its own rows),
replayed; time per boundary = rank 0's median replay / copies. Every rank checks first that
peer_norm's output is bitwise the norm kernel's over the rank-ordered sum of the ranks' rows
(the same check as test/srt/kernels/test_peer_norm.py) and records how far the other arms'
outputs are from it (their sums run in another order).

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.peer_norm_probe --world 2 --out $OUT

Needs --world GPUs of one host (the device tool's nvidia-h200-x2 for two).
"""

from __future__ import annotations

import argparse
import socket

import torch

from . import harness as H

HIDDEN, EPS = 6144, 1e-5


def _rows(seed, m, rank, device):
    g = torch.Generator(device=device).manual_seed(1000 * seed + rank)
    return torch.randn(m, HIDDEN, generator=g, device=device).bfloat16()


def _outputs(m, device):
    return (torch.empty(m, HIDDEN, device=device).bfloat16(),
            torch.empty(m, HIDDEN, device=device).bfloat16(),
            torch.empty(m, HIDDEN, device=device).to(torch.float8_e4m3fn),
            torch.empty(m, HIDDEN // 128, device=device))


def _arms(group, peers, m, copies, dev):
    """{arm: (one replay's work, its outputs)} over `copies` boundaries of m rows."""
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    from sgl_kernel_ext.triton import norm, peer_norm

    w = torch.ones(HIDDEN, device=dev).bfloat16()
    res = _rows(99, m, 0, dev)  # the same residual on every rank
    xs = [_rows(c, m, dist.get_rank(group), dev) for c in range(copies)]
    arms = {}
    outs = [_outputs(m, dev) for _ in range(copies)]

    def fused():
        for x, o in zip(xs, outs):
            peer_norm.all_reduce_add_rms_norm(x, peers, res, w, EPS, *o)
    arms["peer_norm"] = (fused, outs)

    op = getattr(torch.ops.symm_mem, "one_shot_all_reduce_out", None)
    if op is not None:
        ins = [symm_mem.empty((m, HIDDEN), dtype=torch.bfloat16, device=dev) for _ in xs]
        for buf, x in zip(ins, xs):
            buf.copy_(x)
            symm_mem.rendezvous(buf, group)
        summed = [torch.empty(m, HIDDEN, device=dev).bfloat16() for _ in xs]
        souts = [_outputs(m, dev) for _ in range(copies)]
        name = group.group_name

        def one_shot():
            for buf, s, o in zip(ins, summed, souts):
                op.default(buf, "sum", name, s)
                norm.add_rms_norm(s, res, w, EPS, *o)
        arms["symm_mem"] = (one_shot, souts)

    work = [x.clone() for x in xs]
    nouts = [_outputs(m, dev) for _ in range(copies)]

    def nccl():
        for x, y, o in zip(xs, work, nouts):
            y.copy_(x)
            dist.all_reduce(y, group=group)
            norm.add_rms_norm(y, res, w, EPS, *o)
    arms["nccl"] = (nccl, nouts)
    return arms, xs, res, w


def _worker(rank, world, port, ms, copies, replays, result_dirs):
    import torch.distributed as dist

    from sgl_kernel_ext.triton import norm, peer_norm

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=dev)
    group = dist.group.WORLD
    peers = peer_norm.symmetric_rows(group, max(ms), HIDDEN, dev)
    rows_out = []
    meta = {"benchmark": "peer_norm_probe", "world": world, "hidden": HIDDEN, "copies": copies,
            "replays": replays, **H.run_meta(dev)}
    for m in ms:
        arms, xs, res, w = _arms(group, peers, m, copies, dev)
        for name, (fn, outs) in arms.items():
            row = {"arm": name, "M": m}
            try:  # an arm that fails does so on every rank alike (the same code and shapes)
                dist.barrier()
                fn()
                torch.cuda.synchronize()
                if name == "peer_norm":  # bitwise the norm over the rank-ordered sum
                    want = _outputs(m, dev)
                    parts = torch.stack([_rows(copies - 1, m, r, dev).float()
                                         for r in range(world)])
                    norm.add_rms_norm(parts, res, w, EPS, *want)
                    row["bitwise"] = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                                         for a, b in zip(outs[-1], want))
                    reference = outs[-1]
                row["max_abs_diff_residual"] = (outs[-1][1].float()
                                                - reference[1].float()).abs().max().item()
                dist.barrier()
                med, _ = H.time_graph(fn, replays)
                row.update(us=med / copies, failed=peer_norm.failed(peers))
            except Exception as e:  # noqa: BLE001 - recorded, the other arms still run
                row["note"] = f"failed: {type(e).__name__}: {e}"
            rows_out.append(row)
            if rank == 0:
                H.log(f"{name} M={m}: {row}")
    if rank == 0:
        paths = H.write_json("peer_norm_probe", {"meta": meta, "results": rows_out},
                             result_dirs)
        for p in paths:
            H.log(f"wrote {H.portable(str(p))}")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--ms", default="1,2,4,8,16")
    p.add_argument("--copies", type=int, default=8)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--out", default="")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    a = p.parse_args()
    if torch.cuda.device_count() < a.world:
        raise SystemExit(f"peer_norm_probe: --world {a.world} needs as many GPUs of one host, "
                         f"this one has {torch.cuda.device_count()}")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(a.world, port, [int(v) for v in a.ms.split(",")], a.copies,
                            a.replays, [a.results, a.out]), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
