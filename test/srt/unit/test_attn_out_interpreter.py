"""attn_out.absorb_v_o_proj (absorb_v and o_proj as one launch) on CPU under Triton's
interpreter, at the tiny config's TP2 rank: against the torch product of the reference's
numerics, against itself with the attention's chunks merged inside, its counters and sums
left at zero, its tails the heads' partials summed in order."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
    pytest.skip("GPU present: the kernels are tested in test/srt/kernels", allow_module_level=True)

from sgl_kernel_ext.triton import attn_out, mla  # noqa: E402
from sglang.srt.layers.fused_decode.reference.config import tiny_config  # noqa: E402
from sglang.srt.layers.fused_decode.reference.quant import dequant_act, quant_act  # noqa: E402
from sglang.srt.layers.fused_decode.reference.weights import gen_layer  # noqa: E402

CFG = tiny_config()


def _inputs(m, seed):
    lw = gen_layer(CFG, 0, 1, tp_size=2, tp_rank=1)
    a = lw.attn
    nope, v, c = CFG.qk_nope_head_dim, CFG.v_head_dim, CFG.kv_lora_rank
    nh = a.kv_b.shape[0] // (nope + v)
    g = torch.Generator().manual_seed(seed)
    nsp = 3
    part_o = torch.randn(m, nsp, nh, c, generator=g)
    part_ml = torch.stack([torch.randn(m, nsp, nh, generator=g),
                           torch.rand(m, nsp, nh, generator=g) + 0.5], dim=-1)
    part_ml[0, nsp - 1, :, 0], part_ml[0, nsp - 1, :, 1] = float("-inf"), 0.0  # an empty chunk
    olat = torch.full((m, nh, c), float("nan"), dtype=torch.bfloat16)
    mla._combine_kernel[(m, nh)](part_o, part_ml, olat, nh, nsp, C=c, BLOCK_S=4, PDL=False)
    return a, nope, v, nh, (part_o, part_ml), olat


def _two_kernels(a, nope, v, nh, olat):
    """y by the stage kernels: absorb_v (one latent chunk), then fp8_linear's partials summed."""
    from sgl_kernel_ext.triton import fp8_linear

    m, n = olat.shape[0], a.o_proj.q.shape[0]
    oq = torch.zeros(m, nh * v, dtype=torch.float8_e4m3fn)
    os_ = torch.full((m, nh * v // 128), float("nan"))
    mla.absorb_v(olat, a.kv_b, oq, os_, nope, v)
    parts = torch.full((2, m, n), float("nan"))
    fp8_linear.fp8_linear(oq, os_, a.o_proj.q, a.o_proj.s, parts)
    return parts[0] + parts[1]


def _run(a, nope, v, nh, attn_parts, olat, merge, tails, zero=None):
    m, n = olat.shape[0], a.o_proj.q.shape[0]
    sums = torch.zeros(m * nh * v, dtype=torch.int64)
    counts = torch.zeros(2 * nh + 1, dtype=torch.int32)
    parts = torch.full((nh, m, n), float("nan"))
    rows = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    arrivals = torch.zeros(8, dtype=torch.int32)
    attn_out.absorb_v_o_proj(olat if not merge else torch.full_like(olat, float("nan")),
                             attn_parts, merge, a.kv_b, nope, v, a.o_proj.q, a.o_proj.s, sums,
                             counts, parts, (arrivals, rows) if tails else None, zero)
    assert not sums.any() and not counts.any() and not arrivals.any()
    return parts, rows


@pytest.mark.parametrize("m, block_n, w_early, slices",
                         [(1, 64, True, 16), (3, 128, False, 16), (5, 256, True, 16),
                          (2, 64, True, 2)])
def test_one_launch_is_the_torch_product(m, block_n, w_early, slices, monkeypatch):
    """y's head partials summed against the stage kernels (absorb_v, then fp8_linear): within
    1e-3 of max |y| (fp32 order; an e4m3 code of x a step apart where it moved a bf16
    rounding), and near the torch product; every partial written; the tails' rows exactly
    the partials summed in head order and rounded once; two launches bitwise the same."""
    monkeypatch.setattr(attn_out, "BLOCK_N", block_n)
    monkeypatch.setattr(attn_out, "W_EARLY", w_early)
    monkeypatch.setattr(attn_out, "MAX_LATENT_SLICES", slices)
    a, nope, v, nh, attn_parts, olat = _inputs(m, seed=m)
    two = _two_kernels(a, nope, v, nh, olat)
    w_vc = a.kv_b.view(nh, nope + v, -1)[:, nope:].float()
    o = torch.einsum("mhc,hvc->mhv", olat.float(), w_vc).bfloat16().reshape(m, nh * v)
    want = dequant_act(*quant_act(o)) @ a.o_proj.dequant().t()
    parts, rows = _run(a, nope, v, nh, attn_parts, olat, merge=False, tails=True)
    assert not torch.isnan(parts).any()
    got = parts.sum(0)
    # the stage kernels' y, up to fp32 order; the torch product's within the interpreter's
    # bf16 truncation (both kernel forms 1.8e-2 of max |y| from it at one row)
    assert float((got - two).abs().max()) <= 1e-3 * float(two.abs().max())
    assert float((got - want).abs().max()) <= 4e-2 * float(want.abs().max())
    in_order = parts[0].clone()
    for p in parts[1:]:
        in_order += p
    # rounded once to bf16 (the interpreter truncates: the low 16 bits dropped)
    truncated = (in_order.view(torch.int32) & -65536).view(torch.float32).bfloat16()
    assert bool(((rows == in_order.bfloat16()) | (rows == truncated)).all())
    again, _ = _run(a, nope, v, nh, attn_parts, olat, merge=False, tails=False)
    assert torch.equal(again, parts)


@pytest.mark.parametrize("m, block_n", [(1, 64), (3, 128)])
def test_scales_before_the_wait_are_bitwise_the_late_scales(m, block_n, monkeypatch):
    """SCALES_EARLY (with W_EARLY): o_proj's weight scales loaded before the wait, the same
    partials and rows bit for bit, every partial written."""
    monkeypatch.setattr(attn_out, "BLOCK_N", block_n)
    a, nope, v, nh, attn_parts, olat = _inputs(m, seed=20 + m)
    runs = []
    for early in (False, True):
        monkeypatch.setattr(attn_out, "SCALES_EARLY", early)
        runs.append(_run(a, nope, v, nh, attn_parts, olat, merge=False, tails=True))
    (parts, rows), (parts_e, rows_e) = runs
    assert not torch.isnan(parts_e).any() and bool(parts_e.abs().sum() > 0)
    assert torch.equal(parts, parts_e) and torch.equal(rows, rows_e)


@pytest.mark.parametrize("m", [1, 2, 5])
def test_merging_the_attention_inside_is_the_merged_olat(m, monkeypatch):
    """With merge, the programs merge their latent columns from the attention's chunks (one
    empty) and o_lat is not read: bitwise the launch on the merge kernel's o_lat (the same
    arithmetic; the interpreter's sums have one order); q_b's int64 sums passed as `zero`
    come back zeroed."""
    monkeypatch.setattr(attn_out, "BLOCK_N", 64)
    a, nope, v, nh, attn_parts, olat = _inputs(m, seed=10 + m)
    plain, _ = _run(a, nope, v, nh, attn_parts, olat, merge=False, tails=False)
    q_sums = torch.randint(-1000, 1000, (m, 40), dtype=torch.int64)
    merged, _ = _run(a, nope, v, nh, attn_parts, olat, merge=True, tails=False, zero=q_sums)
    assert torch.equal(merged, plain)
    assert not q_sums.any()


def test_latent_slices_and_refusals():
    """LS: a power of two <= the column tiles, slices of >= 16 columns dividing C; a head
    wider than 256 columns or buffers of the wrong shape are refused by name."""
    assert attn_out.latent_slices(24, 512) == 16 and attn_out.latent_slices(12, 512) == 8
    assert attn_out.latent_slices(4, 128) == 4 and attn_out.latent_slices(64, 128) == 8
    assert attn_out.latent_slices(1, 512) == 1 and attn_out.latent_slices(24, 512, 4) == 4
    a, nope, v, nh, attn_parts, olat = _inputs(1, seed=3)
    n = a.o_proj.q.shape[0]
    sums = torch.zeros(nh * v, dtype=torch.int64)
    counts = torch.zeros(2 * nh + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="parts"):
        attn_out.absorb_v_o_proj(olat, attn_parts, False, a.kv_b, nope, v, a.o_proj.q,
                                 a.o_proj.s, sums, counts, torch.zeros(nh + 1, 1, n))
    with pytest.raises(ValueError, match="int64"):
        attn_out.absorb_v_o_proj(olat, attn_parts, False, a.kv_b, nope, v, a.o_proj.q,
                                 a.o_proj.s, sums.int(), counts, torch.zeros(nh, 1, n))


@pytest.mark.parametrize("layer_id, contexts, merge_rows",
                         [(0, [30, 0, 12, 40], 16), (2, [30], 16), (2, [30, 12, 40], 1)],
                         ids=["dense_indexer_4_rows", "moe_shared_1_row",
                              "moe_shared_3_rows_merge_kernel"])
def test_layer_with_the_one_launch_matches_reference(layer_id, contexts, merge_rows,
                                                     monkeypatch):
    """The fused layer with absorb_v and o_proj as one launch (attn_out.MAX_ROWS) against the
    reference, within the interpreter's tolerances (merging the attention's chunks itself up to
    `merge_rows`, after the merge kernel beyond); on a TP shard its tails' rows are bitwise the
    norm summing its partials, and a second step is bitwise the first (its sums and counters
    left at zero)."""
    from sglang.srt.layers.fused_decode.layer import FusedLayer
    from sglang.srt.layers.fused_decode.spec import NUMERICS
    from sglang.srt.layers.fused_decode.testing import (
        clone_caches,
        compare_with_reference,
        make_case,
        shard_rows_checks,
    )

    monkeypatch.setattr(attn_out, "MAX_ROWS", 16)
    monkeypatch.setattr(attn_out, "BLOCK_N", 64)
    monkeypatch.setattr(attn_out, "MERGE_MAX_ROWS", merge_rows)
    launched = []
    real = attn_out.absorb_v_o_proj
    monkeypatch.setattr(attn_out, "absorb_v_o_proj",
                        lambda *a, **k: (launched.append(a[2]), real(*a, **k)))
    case = make_case(CFG, layer_id, contexts, seed=70 + layer_id, tp_size=2)

    def build(cfg, lw, caches, rows, context):
        return FusedLayer(cfg, lw, caches, rows, context, persistent_launch=False)

    r = compare_with_reference(case, build)
    tol = NUMERICS["fused_layer_interpreter"]
    assert launched == [len(contexts) <= merge_rows]  # merging the attention's chunks itself
    assert not r["y_nan"] and r["kv_untouched_bitwise"], r
    assert r["y_rel"] <= tol["y_rel"] and r["residual_rel"] <= tol["residual_rel"], r
    assert r["routing_flips"] <= tol["max_routing_flips"], r
    checks = shard_rows_checks(case, len(contexts), persistent_launch=False)
    assert checks["counters_zero_tails"] and checks["outputs_equal"] and checks["kv_equal"], checks
    layer = FusedLayer(CFG, case.lw, clone_caches(case.caches), len(contexts),
                       case.batch.token_slots.shape[1], persistent_launch=False)
    runs = [[t.clone() for t in layer(case.hidden, case.residual, case.batch, case.topk_prev)]
            for _ in range(2)]
    assert all(torch.equal(x, y) for x, y in zip(*runs))
    assert not layer.buf["vo_sums"].any() and not layer.buf["vo_counts"].any()
    assert layer.health() == []
    layer.buf["vo_counts"][-1] = 1  # the failure word, as a wait that gave up leaves it
    assert any("absorb_v_o_proj gave up" in p for p in layer.health())


def test_a_shape_whose_programs_cannot_all_be_resident_is_refused(monkeypatch):
    """The check before the first launch on a GPU: H200-like multiprocessors (132, 64K
    registers, 228 KB shared memory, 2048 threads); 192 programs of 80 registers and 96 KB
    fit two a multiprocessor, of 200 registers only one (refused, naming the knobs), 96 of
    186 registers and 160 KB one each."""
    from types import SimpleNamespace

    monkeypatch.setattr(attn_out, "_multiprocessors", lambda index: (132, 65536, 233472, 2048))

    def kernel(n_regs, shared):
        return SimpleNamespace(n_regs=n_regs, metadata=SimpleNamespace(shared=shared),
                               _init_handles=lambda: None)

    dev = torch.device("cpu")
    attn_out._check_resident(kernel(80, 96 << 10), 192, 8, dev)
    attn_out._check_resident(kernel(186, 160 << 10), 96, 8, dev)
    with pytest.raises(RuntimeError, match="BLOCK_N"):
        attn_out._check_resident(kernel(200, 96 << 10), 192, 8, dev)
    with pytest.raises(RuntimeError, match="resident"):
        attn_out._check_resident(kernel(80, 160 << 10), 192, 8, dev)
    # AMD's compute units are not counted this way: refused there, naming the knob
    monkeypatch.setattr(torch.version, "hip", "6.4")
    with pytest.raises(RuntimeError, match="ROCm keep attn_out.MAX_ROWS = 0"):
        attn_out._check_resident(kernel(80, 96 << 10), 192, 8, dev)


def test_a_wait_that_outlasts_its_polls_gives_up_and_says_so(monkeypatch):
    """With the products never made (the interpreter's second phase alone), each program's
    wait gives up after SPIN_LIMIT polls: the launch returns and the failure word is set
    (the layer's health naming it: test_layer_with_the_one_launch_matches_reference)."""
    monkeypatch.setattr(attn_out, "INTERPRETER_PHASES", (2,))
    monkeypatch.setattr(attn_out, "SPIN_LIMIT", 3)
    monkeypatch.setattr(attn_out, "BLOCK_N", 128)
    a, nope, v, nh, attn_parts, olat = _inputs(1, seed=4)
    n = a.o_proj.q.shape[0]
    counts = torch.zeros(2 * nh + 1, dtype=torch.int32)
    attn_out.absorb_v_o_proj(olat, attn_parts, False, a.kv_b, nope, v, a.o_proj.q, a.o_proj.s,
                             torch.zeros(nh * v, dtype=torch.int64), counts,
                             torch.zeros(nh, 1, n))
    assert attn_out.failed(counts, nh) and not counts[:nh].any()


def test_tp2_rank_with_the_one_launch_sums_its_attention_across_the_ranks(monkeypatch):
    """Rank 0 of a TP2 MoE layer with the one launch (its tails' rows the all-reduce's input,
    rank 1's attention output added by the reduce) against the reference over both shards."""
    from sglang.srt.layers.fused_decode.layer import FusedLayer
    from sglang.srt.layers.fused_decode.spec import NUMERICS
    from sglang.srt.layers.fused_decode.testing import compare_two_ranks

    monkeypatch.setattr(attn_out, "MAX_ROWS", 16)
    monkeypatch.setattr(attn_out, "BLOCK_N", 64)
    launched = []
    real = attn_out.absorb_v_o_proj
    monkeypatch.setattr(attn_out, "absorb_v_o_proj",
                        lambda *a, **k: (launched.append(k), real(*a, **k)))

    def build(cfg, lw, caches, rows, context):
        return FusedLayer(cfg, lw, caches, rows, context, persistent_launch=False)

    r = compare_two_ranks(CFG, 2, [40, 9], 52, build)
    tol = NUMERICS["fused_layer_interpreter"]
    assert len(launched) == 1 and r["reduce_calls"] == 1 and r["reduced_shape_ok"], r
    assert not r["y_nan"] and r["routing_flips"] <= tol["max_routing_flips"], r
    assert r["y_rel"] <= tol["y_rel"] and r["residual_rel"] <= tol["residual_rel"], r
