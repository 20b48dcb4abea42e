"""The reference draft loop under index_share_for_mtp_iteration (``reference.mtp``): a seeded
loop attends the seed in every iteration and writes no index-K row; an unseeded loop runs its
indexer in the first iteration only and carries that top-k; a carried top-k equal to what the
indexer would pick gives the plain draft step's outputs."""

import torch

from sglang.srt.layers.fused_decode.reference import mtp
from sglang.srt.layers.fused_decode.reference.batch import decode_batch, prefill_batch
from sglang.srt.layers.fused_decode.reference.cache import alloc_caches
from sglang.srt.layers.fused_decode.reference.config import tiny_config
from sglang.srt.layers.fused_decode.reference.weights import generate_weights


def _setup():
    cfg = tiny_config()
    w = generate_weights(cfg, seed=0, mtp=True)
    lid = cfg.num_hidden_layers
    caches = alloc_caches(cfg, 256, layers=[lid])
    g = torch.Generator().manual_seed(1)
    lengths = [20, 7]
    tables = [torch.arange(64, 128), torch.arange(128, 192)]
    ids = torch.randint(2, cfg.vocab_size, (sum(lengths),), generator=g)
    hidden = torch.randn(sum(lengths), cfg.hidden_size, generator=g).bfloat16()
    _, _, topk = mtp.draft_step_topk(cfg, w.mtp, w.embed, w.lm_head, ids, hidden,
                                     prefill_batch(tables, lengths), caches)
    seed = topk[torch.tensor(lengths).cumsum(0) - 1]
    prev = torch.randn(2, cfg.hidden_size, generator=g).bfloat16()
    return cfg, w, lid, caches, seed, decode_batch(lengths, tables), prev


def _clone(caches):
    return type(caches)(kv={k: v.clone() for k, v in caches.kv.items()},
                        index={k: v.clone() for k, v in caches.index.items()})


def test_a_seeded_loop_attends_the_seed_and_writes_no_index_keys():
    cfg, w, lid, caches, seed, batch, prev = _setup()
    index_before = caches.index[lid].clone()
    steps, carried = mtp.draft_iterations(cfg, w.mtp, w.embed, w.lm_head, torch.tensor([5, 6]),
                                          prev, batch, caches, 3, seed)
    assert carried is seed and len(steps) == 3
    assert torch.equal(caches.index[lid], index_before)
    assert all(torch.isfinite(logits).all() for logits, _ in steps)


def test_an_unseeded_loop_carries_its_first_iterations_topk():
    cfg, w, lid, caches, _, batch, prev = _setup()
    ids = torch.tensor([5, 6])
    first = _clone(caches)
    _, _, own = mtp.draft_step_topk(cfg, w.mtp, w.embed, w.lm_head, ids, prev, batch, first)
    written = first.index[lid].clone()
    steps, carried = mtp.draft_iterations(cfg, w.mtp, w.embed, w.lm_head, ids, prev, batch,
                                          caches, 3)
    assert torch.equal(carried, own)
    # only the first iteration wrote index keys: the index cache is the first step's alone
    assert torch.equal(caches.index[lid], written)


def test_a_carried_topk_equal_to_the_indexers_gives_the_plain_step():
    cfg, w, lid, caches, _, batch, prev = _setup()
    ids = torch.tensor([5, 6])
    plain = _clone(caches)
    logits, hidden, own = mtp.draft_step_topk(cfg, w.mtp, w.embed, w.lm_head, ids, prev, batch,
                                              plain)
    logits2, hidden2, attended = mtp.draft_step_topk(cfg, w.mtp, w.embed, w.lm_head, ids, prev,
                                                     batch, caches, carried=own)
    assert attended is own
    assert torch.equal(logits, logits2) and torch.equal(hidden, hidden2)
    assert torch.equal(plain.kv[lid], caches.kv[lid])  # the KV row is written either way
