"""The TP all-reduce fused with the residual add + RMSNorm (``triton.peer_norm``) on two GPUs
of one host: two processes, an NCCL group, the receive buffers in torch's symmetric memory.

Each rank's outputs (bf16 rows, new residual, FP8 rows and scales) bitwise equal
``norm.add_rms_norm`` of every rank's rows summed in rank order (each rank regenerates the
others' rows from their seeds), so the ranks hold the same bits; over several launches
(both halves of the buffers) and from a CUDA graph replayed with new rows; and a rank that
never launches makes the other give up and say so (its failure word), no hang. Needs the
device tool's nvidia-h200-x2; its CPU form (ranks simulated under the interpreter) is
test/srt/unit/test_peer_norm_interpreter.py."""

import socket

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason="needs two GPUs of one host (nvidia-h200-x2)")

H, ROWS, EPS = 6144, 16, 1e-5


def _rows(seed, m, rank, device):
    g = torch.Generator(device=device).manual_seed(1000 * seed + rank)
    return torch.randn(m, H, generator=g, device=device).bfloat16()


def _shared(seed, m, device):  # residual and weight: the same on every rank
    g = torch.Generator(device=device).manual_seed(7 + seed)
    return (torch.randn(m, H, generator=g, device=device).bfloat16(),
            (1 + 0.1 * torch.randn(H, generator=g, device=device)).bfloat16())


def _outputs(m, device):
    return (torch.full((m, H), float("nan"), device=device).bfloat16(),
            torch.full((m, H), float("nan"), device=device).bfloat16(),
            torch.zeros(m, H, device=device).to(torch.float8_e4m3fn),
            torch.full((m, H // 128), float("nan"), device=device))


def _same(got, want):
    return all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
               for a, b in zip(got, want))


def _worker(rank, world, port, stall):
    import torch.distributed as dist

    from sgl_kernel_ext.triton import norm, peer_norm

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=dev)
    try:
        peers = peer_norm.symmetric_rows(dist.group.WORLD, ROWS, H, dev)
        if stall:  # rank 1 never launches: rank 0 must give up, not hang
            peer_norm.SPIN_LIMIT = 1 << 16
            if rank == 0:
                x = _rows(1, 1, 0, dev)
                res, w = _shared(1, 1, dev)
                out = _outputs(1, dev)
                peer_norm.all_reduce_add_rms_norm(x, peers, res, w, EPS, *out)
                torch.cuda.synchronize()
                assert peer_norm.failed(peers)
            dist.barrier()
            return
        for seed, m in enumerate((1, 16, 3, 16), start=1):  # both halves, twice
            x = _rows(seed, m, rank, dev)
            res, w = _shared(seed, m, dev)
            got = _outputs(m, dev)
            peer_norm.all_reduce_add_rms_norm(x, peers, res, w, EPS, *got)
            want = _outputs(m, dev)
            parts = torch.stack([_rows(seed, m, r, dev).float() for r in range(world)])
            norm.add_rms_norm(parts, res, w, EPS, *want)
            torch.cuda.synchronize()
            assert _same(got, want), (rank, seed, m)
            assert peers.state.tolist()[:3] == [seed, 0, 0]
        # a CUDA graph of one launch, replayed with new rows copied in
        m = 4
        x = torch.empty(m, H, device=dev).bfloat16()
        res, w = _shared(9, m, dev)
        got = _outputs(m, dev)
        x.copy_(_rows(8, m, rank, dev))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            peer_norm.all_reduce_add_rms_norm(x, peers, res, w, EPS, *got)
        for seed in range(10, 13):
            x.copy_(_rows(seed, m, rank, dev))
            dist.barrier()
            graph.replay()
            want = _outputs(m, dev)
            parts = torch.stack([_rows(seed, m, r, dev).float() for r in range(world)])
            norm.add_rms_norm(parts, res, w, EPS, *want)
            torch.cuda.synchronize()
            assert _same(got, want), (rank, "replay", seed)
        assert not peer_norm.failed(peers)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stall", [False, True])
def test_two_ranks_get_the_norm_of_their_rank_ordered_sum(stall):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, _free_port(), stall), nprocs=2, join=True)
