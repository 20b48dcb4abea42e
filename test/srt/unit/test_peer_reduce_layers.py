"""The fused layers handed a ``PeerReduce`` (the all-reduce that takes the norm after it into
its launch, ``triton.peer_norm``) on CPU under Triton's interpreter, as one rank of a TP
shard: the stack through ``runtime.run_layers`` must be bitwise the same stack with a plain
all-reduce, while the plain all-reduce then runs once a step (the last layer's output) rather
than twice a layer. One rank, so the sum is the rank's own rows: the exchange between ranks
is peer_norm's own test (test_peer_norm_interpreter.py) and, on two GPUs,
test/srt/kernels/test_peer_norm.py."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
    pytest.skip("GPU present: the kernels are tested in test/srt/kernels", allow_module_level=True)

from sgl_kernel_ext.triton import peer_norm  # noqa: E402
from sglang.srt.layers.fused_decode import runtime  # noqa: E402
from sglang.srt.layers.fused_decode.layer import FusedLayer  # noqa: E402
from sglang.srt.layers.fused_decode.peer_reduce import PeerReduce, fuses_norm  # noqa: E402
from sglang.srt.layers.fused_decode.reference.cache import Caches  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import tiny_config  # noqa: E402
from sglang.srt.layers.fused_decode.testing import clone_caches, make_case  # noqa: E402

CFG = tiny_config()
CONTEXTS = [30, 0, 12]  # a pad row between two rows


def _lone_rank(rows):
    recv, flags, state = peer_norm.buffers(1, rows, CFG.hidden_size, "cpu")
    ptrs = [torch.tensor([t.data_ptr()], dtype=torch.int64) for t in (recv, flags)]
    return peer_norm.PeerRows(0, 1, recv, flags, *ptrs, state)


class Counting:
    """A one-rank all-reduce (the rows as they are) counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, t):
        self.calls += 1
        return t.clone()


def _stack(cases, reduce):
    base = Caches(kv={c.lw.layer_id: c.caches.kv[c.lw.layer_id] for c in cases},
                  index={k: v for c in cases for k, v in c.caches.index.items()})
    caches = clone_caches(base)
    first = cases[0]
    rows, width = first.batch.num_rows, first.batch.token_slots.shape[1]
    layers = [FusedLayer(c.cfg, c.lw, caches, rows, width, persistent_launch=False)
              for c in cases]
    assert all(layer.sharded for layer in layers)
    final = lambda h, r: (h.clone(), r.clone())  # noqa: E731
    hidden, residual = runtime.run_layers(layers, first.hidden, first.batch, reduce, final)
    return hidden, residual, caches


def test_a_stack_with_the_fused_reduce_is_bitwise_the_plain_one():
    """Every tiny layer (dense and MoE, with and without the indexer) of a TP2 shard, two
    steps' worth of state: the final hidden and residual rows and every cache byte equal, the
    plain all-reduce called once (the last layer's output) instead of twice a layer, and the
    fused launches' epochs counted: two a layer but the first (whose input is the embedding)."""
    cases = [make_case(CFG, lid, CONTEXTS, seed=7, tp_size=2)
             for lid in range(CFG.num_hidden_layers)]
    plain = Counting()
    h0, r0, c0 = _stack(cases, plain)
    inner = Counting()
    fused = PeerReduce(_lone_rank(len(CONTEXTS)), inner)
    assert fuses_norm(fused) and not fuses_norm(plain)
    h1, r1, c1 = _stack(cases, fused)
    n = CFG.num_hidden_layers
    assert plain.calls == 2 * n and inner.calls == 1
    assert fused.peers.state[0].item() == 2 * n - 1 and not fused.failed()
    valid = cases[0].batch.valid
    assert not torch.isnan(h0[valid].float()).any()
    assert torch.equal(h0[valid], h1[valid]) and torch.equal(r0[valid], r1[valid])
    for lid in c0.kv:
        assert torch.equal(c0.kv[lid].view(torch.int16), c1.kv[lid].view(torch.int16))
    for lid in c0.index:
        assert torch.equal(c0.index[lid], c1.index[lid])


def test_a_partial_hidden_without_the_fused_reduce_is_refused():
    case = make_case(CFG, 0, CONTEXTS, seed=7, tp_size=2)
    layer = FusedLayer(CFG, case.lw, clone_caches(case.caches), len(CONTEXTS),
                       case.batch.token_slots.shape[1], persistent_launch=False)
    with pytest.raises(ValueError, match="hidden_is_partial needs a reduce"):
        layer(case.hidden, case.residual, case.batch, case.topk_prev, reduce=Counting(),
              hidden_is_partial=True)
