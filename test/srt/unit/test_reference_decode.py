"""Reference decode step at the tiny config: shapes, determinism, cache writes exactly at the
rows' slots (poisoned caches), pad rows, indexer top-k semantics, shared top-k reuse, sparse
attention against a direct computation, TP2 simulation against TP1."""

import pytest
import torch

from sglang.srt.layers.fused_decode.reference import attention, batch as B, cache as K
from sglang.srt.layers.fused_decode.reference import config as C, indexer, model, ops, quant
from sglang.srt.layers.fused_decode.reference import weights as W
from sglang.srt.layers.fused_decode.reference.engine import ReferenceEngine
from sglang.srt.layers.fused_decode.reference.kl import kl_div
from sglang.srt.layers.fused_decode.reference.quant import FP32, SGLANG

CFG = C.tiny_config()


@pytest.fixture(scope="module")
def w():
    return W.generate_weights(CFG, 1)


def _prompts(seed, lengths):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, CFG.vocab_size, (n,), generator=g).tolist() for n in lengths]


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.uint8)


def _snapshot(caches):
    return {("kv", i): _bits(t).clone() for i, t in caches.kv.items()} | {
        ("ix", i): t.clone() for i, t in caches.index.items()}


def _index_bytes_of(slots):
    """(page, byte) positions a slot owns in the index cache, computed from the layout spec."""
    out = []
    for s in slots:
        p, o = divmod(int(s), 64)
        out += [(p, o * 128 + b) for b in range(128)] + [(p, 64 * 128 + o * 4 + b) for b in range(4)]
    return out


def test_decode_writes_exactly_its_slots_and_pad_rows_write_nothing(w):
    eng = ReferenceEngine(CFG, w, num_slots=512, seed=3)  # caches poisoned with NaN
    prompts = _prompts(0, [23, 40, 7])
    rids = [eng.add_request(p, len(p) + 2) for p in prompts]
    logits = eng.prefill(rids)
    assert all(torch.isfinite(l).all() for l in logits)
    before = _snapshot(eng.caches)
    write = [int(eng.requests[r].slots[len(p)]) for r, p in zip(rids, prompts)]
    out = eng.decode([rids[0], None, rids[1], rids[2], None], [5, 0, 6, 7, 0])
    assert out.shape == (5, CFG.vocab_size)
    assert torch.isfinite(out[[0, 2, 3]]).all()  # no valid row read an unwritten slot
    after = _snapshot(eng.caches)
    for (kind, layer), old in before.items():
        new = after[(kind, layer)]
        if kind == "kv":
            changed = (old != new).any(dim=1).nonzero().flatten().tolist()
            assert sorted(changed) == sorted(write), (layer, changed)
            assert torch.isfinite(eng.caches.kv[layer][write].float()).all()
        else:
            diff = (old != new).nonzero().tolist()
            owned = set(_index_bytes_of(write))
            assert diff and all(tuple(d) in owned for d in diff), layer
    assert set(eng.caches.index) == {i for i in range(CFG.num_hidden_layers) if CFG.runs_indexer(i)}


def test_poison_is_detected_when_a_row_reads_an_unwritten_slot(w):
    eng = ReferenceEngine(CFG, w, num_slots=256, seed=4)
    rid = eng.add_request(_prompts(1, [10])[0], 12)
    eng.prefill([rid])
    req = eng.requests[rid]
    req.slots[3] = int(eng._free.pop())  # position 3 now points at a slot nobody wrote
    out = eng.decode([rid], [9])
    assert torch.isnan(out).all()


def test_decode_is_deterministic_and_batch_invariant(w):
    def run(pads, order):
        eng = ReferenceEngine(CFG, w, num_slots=512, seed=5)
        prompts = _prompts(2, [30, 18])
        rids = [eng.add_request(p, len(p) + 2) for p in prompts]
        eng.prefill(rids)
        rows = [rids[i] for i in order] + [None] * pads
        toks = [[11, 12][i] for i in order] + [0] * pads
        out = eng.decode(rows, toks)
        return out[[order.index(0), order.index(1)]]

    a, b = run(0, [0, 1]), run(0, [0, 1])
    assert torch.equal(a, b)
    c = run(3, [1, 0])  # other row order and pad rows: same distribution per request
    assert (kl_div(a, c) < 1e-3).all()


def test_topk_semantics():
    scores = torch.tensor([[0.5, 2.0, -1.0, 2.0, 7.0, float("-inf")],
                           [1.0, 3.0, 2.0, float("-inf"), float("-inf"), float("-inf")],
                           [float("-inf")] * 6])
    lens = torch.tensor([5, 3, 0])
    got = indexer.topk_positions(scores, lens, 3)
    # row 0: 5 > k: best three, the tie 2.0/2.0 keeps both here; ascending positions
    assert got[0].tolist() == [1, 3, 4]
    assert got[1].tolist() == [0, 1, 2]  # L <= k: every position
    assert got[2].tolist() == [-1, -1, -1]  # pad row
    got = indexer.topk_positions(scores, lens, 2)
    assert got[0].tolist() == [1, 4]  # tie between positions 1 and 3 goes to the lower
    got = indexer.topk_positions(scores[:2, :3], torch.tensor([3, 2]), 4)
    assert got.tolist() == [[0, 1, 2, -1], [0, 1, -1, -1]]  # -1 padding when L < k


def test_indexer_scores_match_a_direct_computation(w):
    lw = w.layers[1]
    caches = K.alloc_caches(CFG, 128, layers=[1], poison=True)
    g = torch.Generator().manual_seed(6)
    n = 40
    table = torch.randperm(128, generator=g)[:n]
    x = torch.randn(n, CFG.hidden_size, generator=g).bfloat16()
    c_q = torch.randn(n, CFG.q_lora_rank, generator=g).bfloat16()
    bt = B.prefill_batch([table], [n])
    scores = indexer.index_scores(CFG, lw.attn.indexer, x, c_q, bt, caches.index[1], SGLANG)
    # decode the keys straight from the page bytes
    raw = caches.index[1]
    keys = torch.stack([raw[s // 64, (s % 64) * 128:(s % 64) * 128 + 128] for s in table.tolist()])
    scl = torch.stack([raw[s // 64, 8192 + (s % 64) * 4: 8192 + (s % 64) * 4 + 4] for s in table.tolist()])
    keys = keys.view(torch.float8_e4m3fn).float() * scl.view(torch.float32)
    iw = lw.attn.indexer
    key = (x.float() @ iw.wk.dequant().bfloat16().float().T).bfloat16()
    key = ops.layer_norm(key, iw.k_norm_weight, iw.k_norm_bias, 1e-6)
    key = ops.rope_interleaved(key, bt.positions, CFG.rope_theta, 64)
    torch.testing.assert_close(keys, key, atol=1e-4, rtol=2**-4)  # the e4m3-quantized key
    q = quant.fp8_linear(c_q, iw.wq_b, SGLANG).view(n, 4, 128)
    q = ops.rope_interleaved(q, bt.positions, CFG.rope_theta, 64)
    q8, qs = quant.quant_index_vec(q)
    wr = (x.float() @ iw.weights_proj.float().T).bfloat16().float()
    for t in (0, 17, 39):
        want = torch.full((n,), float("-inf"))
        for s in range(t + 1):
            d = (q8[t].float() * qs[t, :, None]) @ keys[s]
            want[s] = (wr[t] * 128**-0.5 * 4**-0.5 * d.relu()).sum()
        torch.testing.assert_close(scores[t], want, rtol=1e-5, atol=1e-6)


def test_sparse_attention_matches_direct_softmax(w):
    g = torch.Generator().manual_seed(7)
    kv = torch.randn(128, CFG.kv_cache_dim, generator=g).bfloat16()
    table = torch.randperm(128, generator=g)[:30]
    bt = B.decode_batch([29, 29], [table, table])
    q_lat = torch.randn(2, 4, CFG.kv_lora_rank, generator=g).bfloat16()
    q_pe = torch.randn(2, 4, 64, generator=g).bfloat16()
    sel = torch.tensor([[0, 3, 5, 29] + [-1] * 12, list(range(13, 29))])
    got = attention.sparse_mla(CFG, q_lat, q_pe, bt, kv, sel)
    for m in range(2):
        pos = [p for p in sel[m].tolist() if p >= 0]
        rows = kv[table[pos]].float()
        z = torch.cat([q_lat[m], q_pe[m]], -1).float() @ rows.T * 0.0625
        want = torch.softmax(z, -1) @ rows[:, :128]
        torch.testing.assert_close(got[m], want, rtol=1e-5, atol=1e-5)


def test_shared_layer_reuses_previous_topk(w):
    caches = K.alloc_caches(CFG, 256)
    g = torch.Generator().manual_seed(8)
    table = torch.randperm(256, generator=g)[:40]
    h = torch.randn(40, CFG.hidden_size, generator=g).bfloat16()
    bt = B.prefill_batch([table], [40])
    _, _, topk1 = model.layer_forward(CFG, [w.layers[1]], h, None, bt, caches)
    assert topk1.shape == (40, CFG.index_topk)
    assert (topk1[:16] >= 0).sum(1).tolist() == list(range(1, 17)) and (topk1[16:] >= 0).all()
    y_a, _, t_a = model.layer_forward(CFG, [w.layers[2]], h, None, bt, caches, topk1)
    assert t_a is topk1
    other = indexer.topk_positions(torch.randn(40, 40).tril(), bt.seq_lens, CFG.index_topk)
    y_b, _, _ = model.layer_forward(CFG, [w.layers[2]], h, None, bt, caches, other)
    assert not torch.equal(y_a, y_b)
    with pytest.raises(ValueError, match="reuses the previous top-k"):
        model.layer_forward(CFG, [w.layers[2]], h, None, bt, caches, None)


def test_tp2_simulation_matches_tp1(w):
    ranks = [W.generate_weights(CFG, 1, tp_size=2, tp_rank=r) for r in range(2)]
    prompts = _prompts(9, [26, 35])

    def decode(weights, num, reduce=model.sum_partials):
        eng = ReferenceEngine(CFG, weights, num_slots=256, seed=1, num=num, reduce=reduce)
        rids = [eng.add_request(p, len(p) + 1) for p in prompts]
        eng.prefill(rids)
        return eng.decode(rids, [3, 4])

    # in exact arithmetic the ranks' partial sums add up to TP1
    tp1 = decode(w, FP32)
    assert (kl_div(tp1, decode(ranks, FP32)) < 1e-8).all()
    # a reduce that drops rank 1 must change the result (the sum is really taken)
    assert (kl_div(tp1, decode(ranks, FP32, lambda parts: parts[0])) > 1e-3).all()
    # with SGLang numerics the bf16 partials differ by rounding, which each FP8 activation
    # quantization amplifies; compare one layer on the same inputs (same top-k)
    g = torch.Generator().manual_seed(8)
    table = torch.randperm(256, generator=g)[:40]
    h = torch.randn(40, CFG.hidden_size, generator=g).bfloat16()
    bt = B.prefill_batch([table], [40])
    for lid in (0, 1):
        y1, _, t1 = model.layer_forward(CFG, [w.layers[lid]], h, None, bt, K.alloc_caches(CFG, 256))
        y2, _, t2 = model.layer_forward(CFG, [r.layers[lid] for r in ranks], h, None, bt,
                                        K.alloc_caches(CFG, 256))
        assert torch.equal(t1, t2)
        rel = ((y1.float() - y2.float()).norm() / y1.float().norm()).item()
        assert 0 < rel < 0.05, (lid, rel)


@pytest.mark.parametrize("m", [1, 4, 16])
def test_decode_rows_shapes(w, m):
    eng = ReferenceEngine(CFG, w, num_slots=1024, seed=m)
    prompts = _prompts(m, [5 + 3 * i for i in range(m)])
    rids = [eng.add_request(p, len(p) + 1) for p in prompts]
    eng.prefill(rids)
    out = eng.decode(rids, list(range(2, 2 + m)))
    assert out.shape == (m, CFG.vocab_size) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_dense_prefill_equals_sparse_within_topk_and_differs_beyond(w):
    def run(n, dense):
        caches = K.alloc_caches(CFG, 128, poison=True)
        table = torch.randperm(128, generator=torch.Generator().manual_seed(10))[:n]
        return model.prefill(CFG, w, _prompts(10, [n]), [table], caches, dense=dense)[0]

    short = CFG.index_topk  # every context fits in the top-k
    assert torch.equal(run(short, False), run(short, True))
    long_s, long_d = run(40, False), run(40, True)
    assert torch.equal(long_s[:short], long_d[:short])
    assert not torch.equal(long_s[short:], long_d[short:])
    assert torch.isfinite(long_d).all()
