"""The CuTe DSL cluster top-k (``sgl_kernel_ext.nvidia.sm90.cluster_topk``) against a stable
torch sort on a Hopper GPU: every output element, poisoned before each launch, for 1-16 rows of
contexts on both sides of k (int32 and int64 positions, pad rows, rows whose context fits in
k, contexts that end inside a CTA's keys and inside a thread's), widths from 4K to 256K
(contexts past 64K loaded again each pass), rows whose keys load one by one (a width or stride
no multiple of four, a start off 16 bytes) as well as four at a time, scores with many ties
(integers, so the k-th largest is shared across the cluster's CTAs) and with negative and zero
scores; the CTAs sending their histograms to each other (the default) or reading them after
cluster barriers, a reloaded context's next tile prefetched or not (at up to 12 rows), a short
context walking only its share of a thread's keys (with or without a 16-key path) or all of
them; repeated launches, a CUDA-graph replay and
the programmatically dependent launch are bitwise the first, and the output equals the Triton
split top-k's.

Run on the GPU machine with CuTe DSL importable (benchmark/sm90_run.sh stages it).
"""

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a Hopper GPU (run on the lent H200)", allow_module_level=True)
pytest.importorskip("cutlass", reason="needs CuTe DSL (nvidia-cutlass-dsl): benchmark/sm90_run.sh")

from sgl_kernel_ext.nvidia.sm90 import cluster_topk  # noqa: E402
from sgl_kernel_ext.triton import arrival, topk  # noqa: E402

K = 2048


def _reference(scores, positions, k):
    """Ascending positions of each row's k best among its first positions[m] + 1 scores
    (ties to the lowest positions), -1 padded; the whole context where it fits in k."""
    out = torch.full((scores.shape[0], k), -1, dtype=torch.int64, device=scores.device)
    for m in range(scores.shape[0]):
        seq = int(positions[m]) + 1
        if seq <= k:
            out[m, :seq] = torch.arange(seq, device=scores.device)
        else:
            order = torch.sort(scores[m, :seq], descending=True, stable=True).indices[:k]
            out[m] = torch.sort(order).values
    return out


def _case(rows, width, contexts, kind, seed, pos_dtype=torch.int32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "ties":  # a few hundred distinct values: the k-th is shared by many keys
        scores = torch.randint(-200, 200, (rows, width), generator=g, device="cuda").float()
    elif kind == "signs":  # negative, -0.0 and +0.0 among them
        scores = torch.randn(rows, width, generator=g, device="cuda")
        scores[:, ::7] = 0.0
        scores[:, 3::11] = -0.0
    else:
        scores = torch.randn(rows, width, generator=g, device="cuda")
    positions = torch.tensor(contexts, dtype=pos_dtype, device="cuda") - 1
    return scores, positions


def _run(scores, positions, pdl=False):
    out = torch.full((scores.shape[0], K), -7, dtype=torch.int64, device="cuda")
    cluster_topk.topk_positions(scores, positions, K, out, pdl=pdl)
    torch.cuda.synchronize()
    return out


CASES = [
    (1, 8192, [8192], "normal"),
    (1, 32768, [32768], "normal"),
    (4, 32768, [32768, 5000, 2049, 2048], "normal"),
    (3, 65536, [65536, 40001, 1], "normal"),
    (16, 32768, [32768 - 97 * i for i in range(15)] + [0], "normal"),  # the last a pad row
    (2, 4096, [4096, 3000], "ties"),
    (8, 32768, [32768, 30000, 20000, 12345, 9000, 4097, 2500, 2049], "ties"),
    (2, 16384, [16384, 7777], "signs"),
    # wider than the cluster holds at once (a server's table): contexts up to 64K in registers,
    # longer ones loaded again each pass, 2 to 4 tiles a CTA
    (6, 262144, [262144, 200001, 65537, 65536, 32769, 3000], "normal"),
    (3, 131072, [131072, 70000, 40000], "ties"),
    (3, 10003, [10003, 6001, 2050], "normal"),  # no multiple of four wide: one key a load
    # held whole, rolled, past 8 rows (ROLL_ROWS)
    (12, 65536, [65536 - 3001 * i for i in range(12)], "normal"),
]


@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("rows,width,contexts,kind", CASES)
def test_matches_a_stable_sort(rows, width, contexts, kind, pos_dtype):
    scores, positions = _case(rows, width, contexts, kind, seed=rows * width, pos_dtype=pos_dtype)
    want = _reference(scores, positions, K)
    got = _run(scores, positions)
    assert torch.equal(got, want), (got != want).nonzero()[:8].tolist()
    # the Triton split top-k's output too
    m, p = rows, topk.split_chunks(width)
    split = torch.full_like(got, -7)
    topk.topk_positions_split(scores, positions, K, split,
                              torch.zeros(2, m * p * 256, dtype=torch.int32, device="cuda"),
                              torch.zeros(2, m * 2, dtype=torch.int32, device="cuda"),
                              torch.zeros(m * p * 2, dtype=torch.int32, device="cuda"),
                              arrival.counters(2 * m, "cuda"))
    assert torch.equal(got, split)


@pytest.mark.parametrize("knob,value", [("PUSH", False), ("PREFETCH", False), ("SIZED", True),
                                        ("HELD_SIZES", (4, 8)), ("PREFETCH_ROWS", 8),
                                        ("SKIP", False), ("SKIP_WRITE", True),
                                        ("SKIP_RELOADED", False), ("WIDE_CLUSTER", 8),
                                        ("ROLL", False), ("ROLL_ROWS", 8)])
@pytest.mark.parametrize("rows,width,contexts,kind",
                         [CASES[i] for i in (3, 6, 8, 9, 11)]
                         + [(12, 131072, [131072 - 5003 * i for i in range(12)], "normal"),
                            # a 1M table: 16 CTAs a row hold 128K, the next reloads 2 tiles
                            (4, 1 << 20, [131072, 131073, 131071, 98304], "ties")])
def test_forms_off_match_a_stable_sort(rows, width, contexts, kind, knob, value, monkeypatch):
    """Each form with one of its choices turned: the CTAs reading each other's histograms
    after cluster barriers (PUSH), a reloaded context's tiles loaded in turn (PREFETCH), a
    context held in registers walking only its share (SIZED, with or without a 16-key path),
    the next tile prefetched up to 8 rows only (12 reloaded rows unrolled, without it), a
    thread's count walking every key group it holds (SKIP), its tally and write skipping too
    (SKIP_WRITE), a reloaded context's count skipping (SKIP_RELOADED), 8 CTAs a row of a wide
    table at any rows (WIDE_CLUSTER), the four passes unrolled (ROLL) or rolled up to 8 rows
    only (ROLL_ROWS; a held context's past 8 rows unrolled)."""
    monkeypatch.setattr(cluster_topk, knob, value)
    if knob == "HELD_SIZES":
        monkeypatch.setattr(cluster_topk, "SIZED", True)
    scores, positions = _case(rows, width, contexts, kind, seed=3 * rows + width)
    assert torch.equal(_run(scores, positions), _reference(scores, positions, K))


def test_rolled_at_two_ctas_an_sm_matches_a_stable_sort(monkeypatch):
    """The rolled form where a launch's clusters of 8 do not all fit at one CTA an SM (ROLL_ROWS
    16 at 16 reloaded rows on an H100/H200: two CTAs an SM, 128 registers a thread)."""
    held = cluster_topk.clusters_resident(torch.cuda.current_device(), cluster_topk.CLUSTER)
    if held >= 16:
        pytest.skip(f"this GPU holds {held} clusters of 8 at one CTA an SM")
    monkeypatch.setattr(cluster_topk, "ROLL_ROWS", 16)
    assert cluster_topk.launch_form(16, True, torch.cuda.current_device()) == (True, False, 2)
    scores, positions = _case(16, 131072, [131072 - 4001 * i for i in range(16)], "normal",
                              seed=77)
    assert torch.equal(_run(scores, positions), _reference(scores, positions, K))


@pytest.mark.parametrize("start", [0, 1])
def test_rows_off_four_keys_load_one_by_one(start):
    """A view whose stride is no multiple of four (and, start 1, whose first score is off 16
    bytes) takes the one-by-one form; its output is still the stable sort's."""
    whole, positions = _case(3, 20001, [20000, 11111, 3001], "normal", seed=11 + start)
    scores = whole[:, start:start + 20000]
    assert not cluster_topk.vector_loads(scores)
    assert cluster_topk.vector_loads(scores.contiguous())
    got = _run(scores, positions)
    assert torch.equal(got, _reference(scores, positions, K))
    assert torch.equal(got, _run(scores.contiguous(), positions))


def test_repeats_graph_replay_and_pdl_are_bitwise_the_first():
    scores, positions = _case(8, 32768, [32768, 30000, 20000, 12345, 9000, 4097, 2500, 0],
                              "ties", seed=5)
    first = _run(scores, positions)
    for _ in range(100):
        assert torch.equal(_run(scores, positions), first)
    assert torch.equal(_run(scores, positions, pdl=True), first)
    out = torch.full_like(first, -7)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cluster_topk.topk_positions(scores, positions, K, out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cluster_topk.topk_positions(scores, positions, K, out)
    out.fill_(-7)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)


def test_refuses_what_it_cannot_take():
    scores = torch.randn(2, 4096, device="cuda")
    out = torch.empty(2, K, dtype=torch.int64, device="cuda")
    pos = torch.zeros(2, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="scores must be fp32"):
        cluster_topk.topk_positions(scores.half(), pos, K, out)
    with pytest.raises(ValueError, match="positions must be int32 or int64"):
        cluster_topk.topk_positions(scores, pos.float(), K, out)
    with pytest.raises(ValueError, match="out must be a contiguous int64"):
        cluster_topk.topk_positions(scores, pos, K, out[:1])
