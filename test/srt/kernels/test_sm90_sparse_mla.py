"""The CuTe DSL sparse MLA decode (``sgl_kernel_ext.nvidia.sm90.sparse_mla``) against a float64
torch reference on an H200, at one TP8 rank's GLM-5.3 shapes (8 heads, 512 + 64 columns,
2048 top-k entries): every chunk's unnormalized output and (max, sum) for the chunk counts the
layer uses at 1, 3, 9 and 16 rows (one to four 64-entry steps a CTA), rows whose context is
shorter than the top-k (entries -1, chunks with none), int32 and int64 slot tables, a pool's
table read through slot_rows. The cache slots no entry selects hold NaN, outputs are poisoned
with NaN before each launch and every element is checked; repeated launches, a CUDA-graph
replay and the programmatically dependent launch are bitwise the first launch; merged by the
Triton combine, the rows match the Triton kernel's.

Run on the GPU machine with CuTe DSL importable (benchmark/sm90_run.sh stages it).
"""

import math

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a Hopper GPU (run on the lent H200)", allow_module_level=True)
pytest.importorskip("cutlass", reason="needs CuTe DSL (nvidia-cutlass-dsl): benchmark/sm90_run.sh")

from sgl_kernel_ext.nvidia.sm90 import sparse_mla  # noqa: E402
from sgl_kernel_ext.triton import mla  # noqa: E402

TOPK, LATENT, ROPE, HEADS = 2048, 512, 64, 8
SCALE = 1.0 / math.sqrt(192)
# P is rounded to bf16 before the PV product (2^-9 of each term, as the Triton kernel): out
# within 2^-8 of sum_t p_t |v_t|; scores in fp32 from bf16 products
TOL_O = 2.0 ** -8
TOL_M = 2e-3  # absolute, natural-log units (scores of |z| <~ 10)
TOL_L = 4e-3  # relative


def _case(rows, contexts, seed, slot_dtype=torch.int32, pool=False):
    """(qcat, kv_cache, topk, table, slot_rows) with every unselected cache slot NaN."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = max(contexts) + 16
    total = sum(contexts) + 64
    perm = torch.randperm(total, device="cuda", generator=g)
    table = torch.full((rows, width), -7, dtype=torch.int64, device="cuda")
    topk = torch.full((rows, TOPK), -1, dtype=torch.int32, device="cuda")
    used = 0
    for r, ctx in enumerate(contexts):
        table[r, :ctx] = perm[used:used + ctx]
        used += ctx
        chosen = torch.randperm(ctx, device="cuda", generator=g)[:TOPK]
        topk[r, :chosen.numel()] = chosen.to(torch.int32)
    kv = torch.full((total, LATENT + ROPE), float("nan"), dtype=torch.bfloat16, device="cuda")
    for r in range(rows):
        sel = topk[r][topk[r] >= 0].long()
        kv[table[r, sel]] = torch.randn(sel.numel(), LATENT + ROPE, device="cuda",
                                        generator=g).to(torch.bfloat16)
    qcat = (torch.randn(rows, HEADS, LATENT + ROPE, device="cuda", generator=g) * 0.5
            ).to(torch.bfloat16)
    slot_rows = None
    if pool:  # the rows' tables inside a wider pool table, in another order
        order = torch.randperm(rows + 3, device="cuda", generator=g)[:rows]
        wide = torch.full((rows + 3, width), -7, dtype=torch.int64, device="cuda")
        wide[order] = table
        table, slot_rows = wide, order.to(torch.int64)
    return qcat, kv, topk, table.to(slot_dtype), slot_rows


def _reference(qcat, kv, topk, table, slot_rows, splits):
    """float64 (o [M, S, H, 512], m [M, S, H], l [M, S, H], bound [M, S, H, 512])."""
    rows = qcat.shape[0]
    blocks = TOPK // 64
    o = torch.zeros(rows, splits, HEADS, LATENT, dtype=torch.float64, device="cuda")
    mx = torch.full((rows, splits, HEADS), -math.inf, dtype=torch.float64, device="cuda")
    l = torch.zeros(rows, splits, HEADS, dtype=torch.float64, device="cuda")
    bound = torch.zeros_like(o)
    for r in range(rows):
        trow = table[slot_rows[r] if slot_rows is not None else r].long()
        for sp in range(splits):
            lo, hi = sp * blocks // splits * 64, (sp + 1) * blocks // splits * 64
            pos = topk[r, lo:hi].long()
            pos = pos[pos >= 0]
            if pos.numel() == 0:
                continue
            k = kv[trow[pos]].double()
            z = (qcat[r].double() @ k.T) * SCALE
            m = z.max(dim=1).values
            p = torch.exp(z - m[:, None])
            mx[r, sp], l[r, sp] = m, p.sum(dim=1)
            o[r, sp] = p @ k[:, :LATENT]
            bound[r, sp] = p @ k[:, :LATENT].abs()
    return o, mx, l, bound


def _launch(qcat, kv, topk, table, slot_rows, splits, pdl=False, **form):
    rows = qcat.shape[0]
    part_o = torch.full((rows, splits, HEADS, LATENT), float("nan"), device="cuda")
    part_ml = torch.full((rows, splits, HEADS, 2), float("nan"), device="cuda")
    sparse_mla.sparse_attention(qcat, kv, topk, table, SCALE, part_o, part_ml,
                                slot_rows=slot_rows, pdl=pdl, **form)
    return part_o, part_ml


def _check(part_o, part_ml, ref):
    o, mx, l, bound = ref
    assert not part_o.isnan().any() and not part_ml.isnan().any(), "an output left unwritten"
    got_m, got_l = part_ml[..., 0].double(), part_ml[..., 1].double()
    empty = torch.isinf(mx)
    assert torch.equal(torch.isinf(got_m), empty), "chunks without entries differ"
    assert (got_l[empty] == 0).all() and (part_o[empty] == 0).all()
    dm = (got_m[~empty] - mx[~empty]).abs().max().item()
    assert dm <= TOL_M, f"max: {dm}"
    # each chunk's sums relative to its own max: rescale the kernel's to the reference's
    shift = torch.where(empty, 0.0, torch.exp(got_m - torch.where(empty, 0.0, mx)))
    dl = ((got_l * shift - l).abs() / l.clamp_min(1e-30))[~empty].max().item()
    assert dl <= TOL_L, f"sum: {dl}"
    err = (part_o.double() * shift[..., None] - o).abs()
    excess = (err - TOL_O * bound - 1e-4).max().item()
    assert excess <= 0, f"out: max error {err.max().item()} beyond the bound by {excess}"


CASES = {  # rows: contexts (some shorter than the top-k: -1 entries, chunks with none)
    1: [3000],
    3: [2048, 700, 5000],
    9: [4000, 100, 2100, 2048, 3333, 64, 1500, 9000, 2047],
    16: [3000 + 37 * i if i % 3 else 500 + 90 * i for i in range(16)],
}


@pytest.mark.parametrize("rows", sorted(CASES))
@pytest.mark.parametrize("form", ["int32", "int64", "pool", "topk_int64", "3_stages_pool",
                                  "2_gatherers_pool"])
def test_chunks_match_reference(rows, form):
    case = _case(rows, CASES[rows], seed=rows, pool=form.endswith("pool"),
                 slot_dtype=torch.int64 if form == "int64" else torch.int32)
    if form == "topk_int64":  # the layer's top-k buffer
        case = case[:2] + (case[2].to(torch.int64),) + case[3:]
    splits = mla.attention_splits(rows, TOPK)
    kw = {"3_stages_pool": dict(stages=3), "2_gatherers_pool": dict(gatherers=2)}.get(form, {})
    part_o, part_ml = _launch(*case, splits, **kw)
    _check(part_o, part_ml, _reference(*case, splits))


@pytest.mark.parametrize("form", [dict(stages=3), dict(gatherers=2), dict(stages=3, gatherers=2)],
                         ids=["3_stages", "2_gatherers", "3_stages_2_gatherers"])
@pytest.mark.parametrize("rows", [3, 9, 16])
def test_other_forms_are_bitwise_the_default(rows, form):
    """3 stages, two gathering warpgroups: the same math in the same order, so the same
    bits."""
    case = _case(rows, CASES[rows], seed=20 + rows)
    splits = mla.attention_splits(rows, TOPK)
    two = _launch(*case, splits)
    part_o = torch.full((rows, splits, HEADS, LATENT), float("nan"), device="cuda")
    part_ml = torch.full((rows, splits, HEADS, 2), float("nan"), device="cuda")
    sparse_mla.sparse_attention(*case[:4], SCALE, part_o, part_ml, slot_rows=case[4], **form)
    assert torch.equal(part_o, two[0]) and torch.equal(part_ml, two[1])


@pytest.mark.parametrize("rows", [1, 16])
def test_repeat_graph_and_pdl_are_bitwise(rows):
    case = _case(rows, CASES[rows], seed=40 + rows)
    splits = mla.attention_splits(rows, TOPK)
    first = _launch(*case, splits)
    for _ in range(20):
        again = _launch(*case, splits)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(torch.equal(a, b) for a, b in zip(first, _launch(*case, splits, pdl=True)))
    part_o = torch.full_like(first[0], float("nan"))
    part_ml = torch.full_like(first[1], float("nan"))
    qcat, kv, topk, table, slot_rows = case
    sparse_mla.sparse_attention(qcat, kv, topk, table, SCALE, part_o, part_ml)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla.sparse_attention(qcat, kv, topk, table, SCALE, part_o, part_ml, pdl=True)
    part_o.fill_(float("nan"))
    part_ml.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(part_o, first[0]) and torch.equal(part_ml, first[1])


@pytest.mark.parametrize("rows", [1, 9, 16])
def test_merged_rows_match_the_triton_kernel(rows):
    qcat, kv, topk, table, _ = _case(rows, CASES[rows], seed=70 + rows)
    splits = mla.attention_splits(rows, TOPK)
    part_o, part_ml = _launch(qcat, kv, topk, table, None, splits)
    olat = torch.empty(rows, HEADS, LATENT, dtype=torch.bfloat16, device="cuda")
    mla.combine(part_o, part_ml, olat)
    want = torch.empty_like(olat)
    mla.sparse_attention(qcat, kv, topk, table, SCALE, torch.empty_like(part_o),
                         torch.empty_like(part_ml), want, LATENT, ROPE)
    diff = (olat.float() - want.float()).abs().max().item()
    assert diff <= 2e-2 * want.float().abs().max().item(), diff


def test_refuses_other_head_counts():
    qcat = torch.zeros(2, 16, LATENT + ROPE, dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros(8, LATENT + ROPE, dtype=torch.bfloat16, device="cuda")
    topk = torch.zeros(2, TOPK, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="8 heads a rank"):
        sparse_mla.sparse_attention(qcat, kv, topk, topk, SCALE, torch.zeros(2, 1, 16, 512),
                                    torch.zeros(2, 1, 16, 2))
