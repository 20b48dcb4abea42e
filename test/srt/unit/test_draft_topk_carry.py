"""The MTP draft's carried top-k (``fused_decode.carry``): upstream's seed, physical KV slots
or context positions in any order, becomes the fused layer's ascending -1 padded context
positions, in the draft layer's own top-k buffer, with no allocation; a carry it published is
recognized and passed through."""

import pytest
import torch

from sglang.srt.layers.fused_decode import carry
from sglang.srt.layers.fused_decode.reference.batch import RowBatch

K, WIDTH = 16, 300


def _case(seed=0):
    """Three requests on shuffled 64-token pages (a fourth row pads), each with a seed of up
    to K of its positions before its own: (batch, seed positions per row)."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.randperm(40, generator=g)
    tables = [(pages[r * 5:(r + 1) * 5, None] * 64 + torch.arange(64)).flatten()[:WIDTH]
              for r in range(3)]
    table = torch.stack(tables + [torch.zeros(WIDTH, dtype=torch.int64)])
    pos = torch.tensor([100, 200, 12, -1])
    chosen = [torch.randperm(int(p), generator=g)[:K] for p in pos[:3]] + [torch.zeros(0).long()]
    return RowBatch(pos, table), chosen, g


def _expected(chosen):
    exp = torch.full((len(chosen), K), -1, dtype=torch.int64)
    for r, c in enumerate(chosen):
        exp[r, :len(c)] = c.sort().values
    return exp


def _seed(values, g):
    seed = torch.full((len(values), K), -1, dtype=torch.int32)
    for r, v in enumerate(values):
        seed[r, :len(v)] = v.to(torch.int32)
    return seed[:, torch.randperm(K, generator=g)]  # upstream's order is not ascending


def test_physical_slots_become_ascending_positions():
    batch, chosen, g = _case()
    out = torch.full((8, K), 7, dtype=torch.int64)
    c = carry.TopkCarry(out, WIDTH)
    slots = [batch.token_slots[r, ch] for r, ch in enumerate(chosen)]
    ptrs = {n: b.data_ptr() for n, b in c.buf.items()}
    got = c.take(_seed(slots, g), batch, carry.SLOTS)
    assert {n: b.data_ptr() for n, b in c.buf.items()} == ptrs  # written in place, no resize
    assert got.data_ptr() == out.data_ptr() and got.shape == (4, K)
    assert torch.equal(got, _expected(chosen))  # the pad row (position -1) gets none


def test_slots_read_from_a_pool_table_as_from_a_table_a_row():
    """A server's step (runtime.StepRows: each row's request at a row of upstream's int32
    req_to_token, read in place) converts the same seed to the same positions."""
    from sglang.srt.layers.fused_decode.runtime import StepRows

    batch, chosen, g = _case(3)
    slots = [batch.token_slots[r, ch] for r, ch in enumerate(chosen)]
    seed = _seed(slots, g)
    pool = torch.randint(0, 40 * 64, (7, WIDTH + 21), generator=g).to(torch.int32)
    rows = torch.tensor([5, 0, 3, 6])
    pool[rows, :WIDTH] = batch.token_slots.to(torch.int32)
    pooled = StepRows(batch.positions, pool[:, :WIDTH], rows)
    want = carry.TopkCarry(torch.empty(4, K, dtype=torch.int64), WIDTH).take(seed, batch,
                                                                             carry.SLOTS)
    got = carry.TopkCarry(torch.empty(4, K, dtype=torch.int64), WIDTH).take(seed, pooled,
                                                                            carry.SLOTS)
    assert torch.equal(want, _expected(chosen)) and torch.equal(got, want)


def test_positions_are_sorted_and_padded():
    batch, chosen, g = _case(1)
    c = carry.TopkCarry(torch.empty(4, K, dtype=torch.int64), WIDTH)
    assert torch.equal(c.take(_seed(chosen, g), batch, carry.POSITIONS), _expected(chosen))


def test_slots_outside_the_rows_context_are_dropped():
    batch, chosen, g = _case(2)
    c = carry.TopkCarry(torch.empty(4, K, dtype=torch.int64), WIDTH)
    other = batch.token_slots[1, 150]  # request 1's slot, in request 0's seed
    beyond = batch.token_slots[0, 101]  # past row 0's own position
    slots = [torch.cat([batch.token_slots[0, chosen[0][:K - 2]], other[None], beyond[None]])]
    slots += [batch.token_slots[r, ch] for r, ch in enumerate(chosen) if r]
    got = c.take(_seed(slots, g), batch, carry.SLOTS)
    assert torch.equal(got[0], _expected([chosen[0][:K - 2]])[0])


def test_a_published_carry_passes_through():
    batch, chosen, g = _case(3)
    c = carry.TopkCarry(torch.empty(4, K, dtype=torch.int64), WIDTH)
    first = c.take(_seed(chosen, g), batch, carry.POSITIONS)
    before = first.clone()
    assert c.holds(c.published(4)) and not c.holds(before) and not c.holds(None)
    assert c.take(c.published(4), batch, carry.SLOTS) is not None
    assert torch.equal(c.published(4), before)


def test_shapes_are_checked():
    batch, _, _ = _case()
    c = carry.TopkCarry(torch.empty(4, K, dtype=torch.int64), WIDTH)
    with pytest.raises(ValueError, match="attends 16 per row"):
        c.take(torch.zeros(4, K + 1, dtype=torch.int32), batch, carry.SLOTS)
    with pytest.raises(ValueError, match="unknown index space"):
        c.take(torch.zeros(4, K, dtype=torch.int32), batch, "pages")


def test_run_layers_hands_the_carry_to_the_first_layer_only():
    from sglang.srt.layers.fused_decode import runtime

    calls = []

    def layer(hidden, residual, batch, topk, **kw):
        calls.append((topk, kw))
        return hidden + 1, hidden, "own"

    def reduce(y):
        return y

    carried = torch.zeros(1, K, dtype=torch.int64)
    runtime.run_layers([layer, layer], torch.zeros(1), None, reduce, lambda h, r: h,
                       carried=carried)
    assert calls[0][0] is carried and calls[0][1] == {"reuse_topk": True, "reduce": reduce}
    assert calls[1] == ("own", {"reduce": reduce})
    calls.clear()
    runtime.run_layers([layer], torch.zeros(1), None, reduce, lambda h, r: h)
    assert calls == [(None, {"reduce": reduce})]  # no carry: the layer's own path
