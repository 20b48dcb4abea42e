"""The fused layer's launch shapes at GLM-5.3's real sizes (one TP8 rank), on CPU: the grids
that the H200 measurements chose to fit one wave still do (ncu: benchmark/results/
ncu_moe_2aeab55.log; A/B: tiling_probe_20261201T030547Z)."""

import pytest
import triton

from sgl_kernel_ext.triton import fp8_linear, mla
from sglang.srt.layers.fused_decode.reference.config import glm53_config

H200_SMS = 132
CFG = glm53_config()
TP = 8


def _linears():
    """(name, N, K) of the layer's FP8 linears on one rank (q_b with the indexer's wq_b)."""
    heads = CFG.num_attention_heads // TP
    qk = CFG.qk_nope_head_dim + CFG.qk_rope_head_dim
    return [("q_a|kv_a", CFG.q_lora_rank + CFG.kv_lora_rank + CFG.qk_rope_head_dim,
             CFG.hidden_size),
            ("q_b", heads * qk, CFG.q_lora_rank),
            ("q_b|wq_b", heads * qk + CFG.index_n_heads * CFG.index_head_dim, CFG.q_lora_rank),
            ("o_proj", CFG.hidden_size, heads * CFG.v_head_dim)]


@pytest.mark.parametrize("name, n, k", _linears(), ids=[n for n, _, _ in _linears()])
def test_fp8_linears_fit_one_wave_of_two_programs_a_multiprocessor(name, n, k):
    block_n, groups, split = fp8_linear.tiling(n, k)
    programs = triton.cdiv(n, block_n) * split
    assert programs <= fp8_linear.TARGET_PROGRAMS <= 2 * H200_SMS, (name, split, programs)
    assert programs >= fp8_linear.TARGET_PROGRAMS // 2 or split == triton.cdiv(k, 128) // groups


@pytest.mark.parametrize("rows", range(1, 17))
def test_attention_fits_one_wave_of_one_program_a_multiprocessor(rows):
    splits = mla.attention_splits(rows, CFG.index_topk)
    assert rows * splits <= H200_SMS, (rows, splits)
    block_t, blocks = mla.attention_step(CFG.index_topk, splits)
    assert blocks * block_t == CFG.index_topk and splits <= blocks  # no chunk empty
    fewest = -(-blocks // min(blocks, H200_SMS // rows))  # loop steps one wave allows
    assert -(-blocks // splits) == fewest, (rows, splits)
    if splits > 1:  # no chunk to spare: one fewer would take more steps
        assert -(-blocks // (splits - 1)) > fewest, (rows, splits)


@pytest.mark.parametrize("parts, kv_lora, steps, want", [(1, 512, 4, 1), (8, 512, 4, 8),
                                                         (8, 64, 3, 4), (16, 512, 3, 16),
                                                         (4, 16, 4, 1), (8, 512, 2, 1)])
def test_attention_column_tiles_are_at_least_16_wide_and_skip_short_programs(
        parts, kv_lora, steps, want, monkeypatch):
    monkeypatch.setattr(mla, "ATTN_PARTS", parts)
    monkeypatch.setattr(mla, "ATTN_PARTS_FROM_STEPS", 3)
    assert mla.attention_parts(kv_lora, steps) == want and kv_lora // want >= 16


@pytest.mark.parametrize("parts", [0, 3, 6])
def test_attention_column_tiles_refuse_a_count_not_a_power_of_two(parts, monkeypatch):
    monkeypatch.setattr(mla, "ATTN_PARTS", parts)
    with pytest.raises(ValueError, match="power of two"):
        mla.attention_parts(512, 4)


@pytest.mark.parametrize("rows", range(1, 17))
@pytest.mark.parametrize("width", [4096, 9000, 32768, 65536, 131072, 262144, 524288])
def test_one_launch_topk_programs_are_all_resident_at_once(rows, width):
    """The one-launch split top-k waits inside its launch for a row's other programs, so it
    may run only where every program holds a multiprocessor at once, and each program holds
    every chunk's histogram of its row (ONE_LAUNCH_MAX_ROW_PROGRAMS); chunks grow (powers of
    two of SPLIT_CHUNK) only as far as that needs, and past ONE_LAUNCH_MAX_CHUNK it declines."""
    from sgl_kernel_ext.triton import topk

    chunk = topk.one_launch_chunk(rows, width, H200_SMS)
    fits = [c for c in (topk.SPLIT_CHUNK << i for i in range(8))
            if c <= topk.ONE_LAUNCH_MAX_CHUNK and rows * triton.cdiv(width, c) <= H200_SMS
            and triton.cdiv(width, c) <= topk.ONE_LAUNCH_MAX_ROW_PROGRAMS]
    assert chunk == (fits[0] if fits else 0), (rows, width, chunk)
    if chunk:
        assert chunk % topk.SPLIT_CHUNK == 0 and triton.cdiv(width, chunk) <= topk.split_chunks(width)


@pytest.mark.parametrize("rows", range(1, 17))
@pytest.mark.parametrize("context_length", [8192, 32768, 131072, 1 << 20])
def test_index_grids_are_bounded_and_plain_to_32k(rows, context_length):
    """A server's slot table is its context length + 16 wide (hooks.build_plan), and programs
    past a row's context exit but cost their launch: the index scores' and the split top-k's
    launches stay within an eighth of their caps (looping past them), and a table of a 32K
    context length (+16) keeps a program a block / chunk at 1-16 rows (the form timed at 32K)."""
    from sgl_kernel_ext.triton import indexer, topk

    width = context_length + 16
    blocks = triton.cdiv(width, indexer.SCORE_BLOCK)
    scores = indexer.score_programs(rows, width)
    split = topk.split_programs(rows, width)
    cap = indexer.score_row_programs(rows)
    assert scores <= blocks and scores <= cap + cap // 8, scores
    assert indexer.SCORE_MIN_ROW_PROGRAMS <= cap <= indexer.SCORE_MAX_ROW_PROGRAMS
    assert split <= topk.split_chunks(width)
    assert rows * split <= topk.SPLIT_MAX_PROGRAMS + topk.SPLIT_MAX_PROGRAMS // 8, split
    if context_length <= 32768:
        assert scores == blocks and split == topk.split_chunks(width), (scores, split)


def test_int32_slot_tables_refuse_caches_their_offsets_overflow():
    """Slots read from an int32 table (upstream's req_to_token) address their caches in int32
    (mla.slot_args): a cache of 2**31 elements or more is refused with the reason, an int64
    table addresses it, and a table of another type is refused."""
    import torch

    table = torch.zeros(2, 8, dtype=torch.int32)
    rows, pos = torch.tensor([1, 0]), torch.tensor([3, 4])
    small = torch.empty(4, 576, dtype=torch.bfloat16)
    huge = torch.empty(1, dtype=torch.bfloat16).expand(2**31)  # no storage behind it
    (_, stride, got_rows), on = mla.slot_args(table, rows, pos, small)
    assert on and stride == 8 and got_rows is rows
    with pytest.raises(ValueError, match="overflow int32"):
        mla.slot_args(table, rows, pos, small, huge)
    (_, _, stand_in), on = mla.slot_args(table.to(torch.int64), None, pos, huge)
    assert not on and stand_in is pos
    with pytest.raises(ValueError, match="int32 or int64"):
        mla.slot_args(table.to(torch.int16), rows, pos)
