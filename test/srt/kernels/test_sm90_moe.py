"""The CuTe DSL MoE experts (``sgl_kernel_ext.nvidia.sm90.fp8_moe``: gate/up + SwiGLU + the
down input's per-128 quant, then down with the routing weights) on an H200, against a float64
torch reference and against the Triton kernels (``triton.moe``) on the same slot table.

Routing is drawn at random (distinct experts a row, random weights); gate and up are views of
one [E, 2I, H] stack, as SGLang's w13; the slot table's entries past num_slots hold expert ids
out of range and NaN weights (never read); x's rows past M and every output are NaN-poisoned
before a launch. Also: repeated launches and a CUDA-graph replay bitwise equal to the first,
pdl bitwise equal to the plain launch, the arrival counters left at zero, refusals; and
``experts`` (both in one launch) bitwise equal to the two launches.

Run on the GPU machine with CuTe DSL importable (benchmark/sm90_run.sh stages it).
"""

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a Hopper GPU (run on the lent H200)", allow_module_level=True)
pytest.importorskip("cutlass", reason="needs CuTe DSL (nvidia-cutlass-dsl): benchmark/sm90_run.sh")

from sgl_kernel_ext.nvidia.sm90 import fp8_moe  # noqa: E402
from sgl_kernel_ext.nvidia.sm90.fp8_mma import x_rows  # noqa: E402

E4M3 = torch.float8_e4m3fn
SMS = torch.cuda.get_device_properties(0).multi_processor_count
# wgmma's FP8 sums within a 128-column group are less precise than fp32: 2^-11 of sum |x w|
# (test_sm90_linear.TOL_MMA, measured there)
TOL_MMA = 2.0 ** -11
# Activations are checked against the float64 SwiGLU with a bound carried through each step
# (_act_reference): g and u off by TOL_MMA of sum |x w| and then a bf16 ulp (2^-7) each, SiLU's
# slope at most 1.1, a's bf16 another ulp; then e4m3's half ulp (2^-4 relative, or 2^-10 of
# the scale where subnormal), and the scale (max |a| / 448) off by max |da| / 448.
BF16_ULP, E4M3_HALF_ULP = 2.0 ** -7, 2.0 ** -4


class Moe:
    """Random experts of one TP rank's MoE: E routed (gate/up views of a w13 stack) and a
    shared one, x for m rows, and a routing of top-k distinct experts a row."""

    def __init__(self, m, e, inter, hidden, topk, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
        u = lambda *s: torch.rand(*s, device="cuda", generator=g) * 0.02 + 0.002  # noqa: E731
        self.m, self.e, self.inter, self.hidden, self.topk = m, e, inter, hidden, topk
        self.w13 = (r(e, 2 * inter, hidden) * 2).to(E4M3)
        self.w13_s = u(e, 2 * inter // 128, hidden // 128)
        self.gate, self.up = self.w13[:, :inter], self.w13[:, inter:]
        self.gate_s, self.up_s = self.w13_s[:, :inter // 128], self.w13_s[:, inter // 128:]
        self.down = (r(e, hidden, inter) * 2).to(E4M3)
        self.down_s = u(e, hidden // 128, inter // 128)
        self.sh_gate, self.sh_up = ((r(inter, hidden) * 2).to(E4M3) for _ in range(2))
        self.sh_gate_s, self.sh_up_s = (u(inter // 128, hidden // 128) for _ in range(2))
        self.sh_down = (r(hidden, inter) * 2).to(E4M3)
        self.sh_down_s = u(hidden // 128, inter // 128)
        self.xq = (r(m, hidden) * 2).to(E4M3)
        self.sx = torch.rand(m, hidden // 128, device="cuda", generator=g) + 0.5
        # routing: row r chooses topk distinct experts with positive weights
        choice = torch.stack([torch.randperm(e, device="cuda", generator=g)[:topk]
                              for _ in range(m)]).sort(dim=1).values
        used = torch.unique(choice)
        self.slots_max = m * topk + 1
        n = 1 + used.numel()
        self.num_slots = torch.tensor([n], dtype=torch.int32, device="cuda")
        se = torch.full((self.slots_max,), 10 ** 6, dtype=torch.int32, device="cuda")
        se[0] = e
        se[1:n] = used.int()
        sw = torch.full((self.slots_max, m), float("nan"), device="cuda")
        sr = torch.full((self.slots_max, m), -7, dtype=torch.int32, device="cuda")
        sw[0], sr[0] = 1.0, 0
        sw[1:n], sr[1:n] = 0.0, -1
        weight = torch.rand(m, topk, device="cuda", generator=g) + 0.1
        for row in range(m):
            for j in range(topk):
                s = 1 + int((used == choice[row, j]).nonzero())
                sw[s, row] = weight[row, j]
                sr[s, row] = j + 1  # the expert's place in the row's ascending choice
        self.slot_expert, self.slot_weight, self.slot_rank = se, sw, sr
        self.n = n

    def expert(self, slot):
        """(gate, up, down) dequantized float64 weights of a slot's expert."""
        ex = int(self.slot_expert[slot])
        deq = lambda q, s: q.double() * s.double().repeat_interleave(  # noqa: E731
            128, 0).repeat_interleave(128, 1)
        if ex == self.e:
            return (deq(self.sh_gate, self.sh_gate_s), deq(self.sh_up, self.sh_up_s),
                    deq(self.sh_down, self.sh_down_s))
        return (deq(self.gate[ex], self.gate_s[ex]), deq(self.up[ex], self.up_s[ex]),
                deq(self.down[ex], self.down_s[ex]))

    def x(self):
        return self.xq.double() * self.sx.double().repeat_interleave(128, 1)

    def buffers(self):
        """gate/up's outputs and scratch, NaN-poisoned (arrivals at zero)."""
        nx, s, i = x_rows(self.m), self.slots_max, self.inter
        rows = fp8_moe.gate_up_parts_rows(s, i, self.hidden, SMS * fp8_moe.GROUPS)
        parts = torch.full((rows, self.m, 2 * i), float("nan"), device="cuda")
        arrivals = torch.zeros(s * (i // 128), dtype=torch.int32, device="cuda")
        act_q = torch.full((s * nx, i), 0x7F, dtype=torch.uint8, device="cuda").view(E4M3)
        act_s = torch.full((s * self.m, i // 128), float("nan"), device="cuda")
        return parts, arrivals, act_q, act_s

    def padded_x(self):
        buf = torch.full((x_rows(self.m), self.hidden), 0x7F, dtype=torch.uint8,
                         device="cuda").view(E4M3)
        buf[: self.m] = self.xq
        return buf

    def gate_up(self, parts, arrivals, act_q, act_s, **kw):
        fp8_moe.gate_up(self.padded_x(), self.sx, self.gate, self.gate_s, self.up, self.up_s,
                        self.sh_gate, self.sh_gate_s, self.sh_up, self.sh_up_s,
                        self.slot_expert, self.num_slots, parts, arrivals, act_q, act_s, **kw)

    def down_into(self, act_q, act_s, terms, **kw):
        fp8_moe.down(act_q, act_s, self.down, self.down_s, self.sh_down, self.sh_down_s,
                     self.slot_expert, self.num_slots, self.slot_weight, self.slot_rank, terms,
                     **kw)


def _act_reference(moe, slot):
    """(a, scale, da, dscale) float64 of a slot for every row: SwiGLU of bf16-rounded g and u
    (bf16 out), each 128 columns' max |a| / 448, and the bounds on a kernel's a and scale."""
    g_w, u_w, _ = moe.expert(slot)
    x = moe.x()
    g = (x @ g_w.T).to(torch.bfloat16).double()
    u = (x @ u_w.T).to(torch.bfloat16).double()
    dg = TOL_MMA * (x.abs() @ g_w.abs().T) + BF16_ULP * g.abs()
    du = TOL_MMA * (x.abs() @ u_w.abs().T) + BF16_ULP * u.abs()
    silu = g / (1.0 + torch.exp(-g))
    a = (silu * u).to(torch.bfloat16).double()
    da = 1.1 * dg * (u.abs() + du) + silu.abs() * du + BF16_ULP * a.abs()
    amax = a.abs().view(moe.m, -1, 128).amax(dim=2)
    dscale = da.view(moe.m, -1, 128).amax(dim=2) / 448.0
    return a, amax.clamp(min=1e-10) / 448.0, da, dscale


def _check_act(moe, act_q, act_s):
    nx = x_rows(moe.m)
    for slot in range(moe.n):
        a, scale, da, dscale = _act_reference(moe, slot)
        got_s = act_s[slot * moe.m:(slot + 1) * moe.m].double()
        assert torch.isfinite(got_s).all(), f"slot {slot}: scales not all written"
        err_s = (got_s - scale).abs() - dscale
        assert (err_s <= 0).all(), f"slot {slot}: scales off by {err_s.max():.3g} past bound"
        q = act_q[slot * nx:slot * nx + moe.m].double()
        assert torch.isfinite(q).all(), f"slot {slot}: activations not all written"
        deq = q * got_s.repeat_interleave(128, 1)
        bound = (da * (1 + E4M3_HALF_ULP) + E4M3_HALF_ULP * a.abs()
                 + got_s.repeat_interleave(128, 1) * 2.0 ** -10)
        err = (deq - a).abs() - bound
        assert (err <= 0).all(), f"slot {slot}: activations off by {err.max():.3g} past bound"


def _terms_reference(moe, act_q, act_s):
    """(terms, bound) float64 [M, TERMS, H] of down from given activations."""
    nx, m = x_rows(moe.m), moe.m
    terms = torch.full((m, moe.topk + 1, moe.hidden), float("nan"), dtype=torch.float64,
                       device="cuda")
    bound = torch.zeros_like(terms)
    for slot in range(moe.n):
        _, _, d_w = moe.expert(slot)
        x = act_q[slot * nx:slot * nx + m].double() * \
            act_s[slot * m:(slot + 1) * m].double().repeat_interleave(128, 1)
        y, mag = x @ d_w.T, x.abs() @ d_w.abs().T
        for row in range(m):
            rank = int(moe.slot_rank[slot, row])
            if rank >= 0:
                w = float(moe.slot_weight[slot, row])
                terms[row, rank] = w * y[row]
                bound[row, rank] = (1 + 2.0 ** -8) * w * TOL_MMA * mag[row] + 2.0 ** -8 * (w * y[row]).abs()
    return terms, bound


SHAPES = [  # (rows, experts, intermediate, hidden, top-k): one TP8 rank's GLM-5.3 MoE, then small
    (1, 256, 256, 6144, 8), (2, 256, 256, 6144, 8), (3, 256, 256, 6144, 8),
    (8, 256, 256, 6144, 8), (16, 256, 256, 6144, 8), (9, 12, 384, 1024, 4), (16, 4, 128, 256, 2)]


@pytest.mark.parametrize("m,e,inter,hidden,topk", SHAPES)
def test_gate_up_matches_reference(m, e, inter, hidden, topk):
    moe = Moe(m, e, inter, hidden, topk, seed=m + e)
    parts, arrivals, act_q, act_s = moe.buffers()
    moe.gate_up(parts, arrivals, act_q, act_s, pdl=True)
    torch.cuda.synchronize()
    _check_act(moe, act_q, act_s)
    assert int(arrivals.abs().sum()) == 0, "arrival counters not left at zero"


@pytest.mark.parametrize("m,e,inter,hidden,topk", SHAPES)
def test_down_matches_reference(m, e, inter, hidden, topk):
    moe = Moe(m, e, inter, hidden, topk, seed=100 + m + e)
    _, _, act_q, act_s = moe.buffers()
    g = torch.Generator(device="cuda").manual_seed(m)
    nx = x_rows(m)
    for slot in range(moe.n):  # activations of each used slot's rows (past M: NaN)
        act_q[slot * nx:slot * nx + m] = (torch.randn(m, inter, device="cuda", generator=g)
                                          * 50).to(E4M3)
        act_s[slot * m:(slot + 1) * m] = torch.rand(m, inter // 128, device="cuda",
                                                    generator=g) * 0.01 + 0.001
    terms = torch.full((m, topk + 1, hidden), float("nan"), dtype=torch.bfloat16,
                       device="cuda")
    moe.down_into(act_q, act_s, terms, pdl=True)
    torch.cuda.synchronize()
    ref, bound = _terms_reference(moe, act_q, act_s)
    got = terms.double()
    assert torch.isfinite(got).all(), "terms not all written"
    err = (got - ref).abs() - bound
    assert (err <= 0).all(), f"terms off by {err.max():.3g} past the bound"


def _run_chain(moe, bufs, terms, **kw):
    parts, arrivals, act_q, act_s = bufs
    moe.gate_up(parts, arrivals, act_q, act_s, **kw)
    moe.down_into(act_q, act_s, terms, **kw)


@pytest.mark.parametrize("m", [1, 4, 16])
def test_chain_repeats_and_replays_bitwise(m):
    """gate_up then down: 10 launches, pdl and plain, and a graph replay bitwise equal."""
    moe = Moe(m, 256, 256, 6144, 8, seed=7 * m)
    bufs = moe.buffers()
    terms = torch.full((m, 9, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")
    _run_chain(moe, bufs, terms)
    first = (terms.clone(), bufs[2].clone(), bufs[3].clone())
    for pdl in (False, True) * 5:
        terms.fill_(float("nan"))
        bufs[3].fill_(float("nan"))
        _run_chain(moe, bufs, terms, pdl=pdl)
        assert torch.equal(terms.view(torch.int16), first[0].view(torch.int16)), f"pdl={pdl}"
        assert torch.equal(bufs[3].view(torch.int32), first[2].view(torch.int32)), "scales"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run_chain(moe, bufs, terms, pdl=True)
    for _ in range(2):
        terms.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(terms.view(torch.int16), first[0].view(torch.int16)), "replay"
    assert int(bufs[1].abs().sum()) == 0


@pytest.mark.parametrize("m", [1, 2, 8, 16])
def test_chain_matches_triton_moe(m):
    """The same slot table through triton.moe's gate_up and down: terms within the two
    kernels' rounding of each other (a cross-check; each kernel's bound against float64 is in
    the tests above). Where g or u round to another bf16, an activation can land an e4m3
    step apart (2^-3 of it): at 16 rows one term moved 0.035 of its row's largest
    (c29b9b7, H200), hence 2^-4."""
    from sgl_kernel_ext.triton import moe as tmoe

    moe = Moe(m, 256, 256, 6144, 8, seed=3 + m)
    bufs = moe.buffers()
    terms = torch.full((m, 9, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")
    _run_chain(moe, bufs, terms, pdl=True)
    act = torch.empty(moe.slots_max, m, moe.inter, dtype=torch.bfloat16, device="cuda")
    tiling = tmoe.gate_up_tiling(m, False)
    gu_parts = None
    if tiling[2] > 1:
        gu_parts = torch.empty(tiling[2], moe.slots_max, m, 2, moe.inter, device="cuda")
    arr = torch.zeros(moe.slots_max * moe.inter, dtype=torch.int32, device="cuda")
    tmoe.gate_up(moe.xq, moe.sx, moe.e, moe.slot_expert.clamp(max=moe.e), moe.num_slots,
                 moe.gate, moe.gate_s, moe.up, moe.up_s, moe.sh_gate, moe.sh_gate_s,
                 moe.sh_up, moe.sh_up_s, act, gu_parts, tiling=tiling, arrivals=arr)
    ref = torch.full_like(terms, float("nan"))
    out = torch.empty(m, 6144, dtype=torch.bfloat16, device="cuda")
    pos = torch.arange(m, dtype=torch.int64, device="cuda")
    block_n, warps = tmoe.down_shape(m, False)
    tmoe.down(act, moe.e, moe.slot_expert.clamp(max=moe.e), moe.slot_weight.nan_to_num(0.0),
              moe.slot_rank.clamp(min=-1), moe.num_slots, moe.down, moe.down_s, moe.sh_down,
              moe.sh_down_s, pos, ref, out, block_n=block_n, num_warps=warps)
    torch.cuda.synchronize()
    got, want = terms.float(), ref.float()
    scale = want.abs().amax(dim=2, keepdim=True)
    assert ((got - want).abs() <= 2.0 ** -4 * scale).all(), \
        f"terms differ from Triton's by {((got - want).abs() / scale).max():.3g} of a row's max"


def _run_experts(moe, bufs, flags, terms, **kw):
    parts, arrivals, act_q, act_s = bufs
    fp8_moe.experts(moe.padded_x(), moe.sx, moe.gate, moe.gate_s, moe.up, moe.up_s, moe.down,
                    moe.down_s, moe.sh_gate, moe.sh_gate_s, moe.sh_up, moe.sh_up_s, moe.sh_down,
                    moe.sh_down_s, moe.slot_expert, moe.num_slots, moe.slot_weight,
                    moe.slot_rank, parts, arrivals, flags, act_q, act_s, terms, **kw)


def _flags(moe):
    return torch.zeros(fp8_moe.flags_size(moe.slots_max, moe.inter), dtype=torch.int32,
                       device="cuda")


def _nan_terms(moe):
    return torch.full((moe.m, moe.topk + 1, moe.hidden), float("nan"), dtype=torch.bfloat16,
                      device="cuda")


def _grid_buffers(moe, grid):
    """moe.buffers(), the partials with a row for every (slot, K group): enough for any
    grid's split."""
    parts, arrivals, act_q, act_s = moe.buffers()
    if grid:
        parts = torch.full((moe.slots_max * (moe.hidden // 128), moe.m, 2 * moe.inter),
                           float("nan"), device="cuda")
    return parts, arrivals, act_q, act_s


# the shapes above, one whose down has more 128-column groups (8) than a warpgroup's ring
# slots (3: its activations are loaded as the slots free), and fewer CTAs than multiprocessors
# (more units each, both phases)
EXPERTS_CASES = [(*shape, 0) for shape in SHAPES] + [
    (4, 8, 1024, 512, 2, 0), (16, 256, 256, 6144, 8, 30), (3, 256, 256, 6144, 8, 7)]


@pytest.mark.parametrize("m,e,inter,hidden,topk,grid", EXPERTS_CASES)
def test_experts_equals_two_launches(m, e, inter, hidden, topk, grid):
    """``experts`` (gate/up and down in one launch): activations, their scales and the terms
    bitwise those of gate_up then down, and within the float64 bounds; the flags, the error
    word and the arrival counters left at zero."""
    moe = Moe(m, e, inter, hidden, topk, seed=200 + m + e)
    bufs = _grid_buffers(moe, grid)
    want = _nan_terms(moe)
    _run_chain(moe, bufs, want, pdl=True, grid=grid)
    bufs2, flags, got = _grid_buffers(moe, grid), _flags(moe), _nan_terms(moe)
    _run_experts(moe, bufs2, flags, got, pdl=True, grid=grid)
    torch.cuda.synchronize()
    assert int(flags.abs().sum()) == 0, f"flags not left at zero: {flags.nonzero().tolist()}"
    assert int(bufs2[1].abs().sum()) == 0, "arrival counters not left at zero"
    _check_act(moe, bufs2[2], bufs2[3])
    ref, bound = _terms_reference(moe, bufs2[2], bufs2[3])
    assert torch.isfinite(got).all(), "terms not all written"
    err = (got.double() - ref).abs() - bound
    assert (err <= 0).all(), f"terms off by {err.max():.3g} past the bound"
    assert torch.equal(bufs2[2].view(torch.uint8), bufs[2].view(torch.uint8)), "activations"
    assert torch.equal(bufs2[3].view(torch.int32), bufs[3].view(torch.int32)), "scales"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "terms"


@pytest.mark.parametrize("m", [1, 16])
def test_experts_repeats_and_replays_bitwise(m):
    """10 launches of ``experts``, pdl and plain, and graph replays: bitwise the first."""
    moe = Moe(m, 256, 256, 6144, 8, seed=11 * m)
    bufs, flags, terms = moe.buffers(), _flags(moe), _nan_terms(moe)
    _run_experts(moe, bufs, flags, terms)
    first = (terms.clone(), bufs[3].clone())
    for pdl in (False, True) * 5:
        terms.fill_(float("nan"))
        bufs[3].fill_(float("nan"))
        _run_experts(moe, bufs, flags, terms, pdl=pdl)
        assert torch.equal(terms.view(torch.int16), first[0].view(torch.int16)), f"pdl={pdl}"
        assert torch.equal(bufs[3].view(torch.int32), first[1].view(torch.int32)), "scales"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run_experts(moe, bufs, flags, terms, pdl=True)
    for _ in range(3):
        terms.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(terms.view(torch.int16), first[0].view(torch.int16)), "replay"
    assert int(flags.abs().sum()) == 0 and int(bufs[1].abs().sum()) == 0
    fp8_moe.check_flags(flags)


def test_experts_refuses_bad_input():
    moe = Moe(2, 8, 128, 256, 2, seed=1)
    bufs, flags, terms = moe.buffers(), _flags(moe), _nan_terms(moe)
    with pytest.raises(ValueError, match="all must be resident"):
        _run_experts(moe, bufs, flags, terms, grid=SMS + 1)
    with pytest.raises(ValueError, match="flags must be"):
        _run_experts(moe, bufs, flags[:-1], terms)
    with pytest.raises(ValueError, match="shared down must be"):
        fp8_moe.experts(moe.padded_x(), moe.sx, moe.gate, moe.gate_s, moe.up, moe.up_s,
                        moe.down, moe.down_s, moe.sh_gate, moe.sh_gate_s, moe.sh_up,
                        moe.sh_up_s, moe.sh_gate, moe.sh_down_s, moe.slot_expert,
                        moe.num_slots, moe.slot_weight, moe.slot_rank, *bufs[:2], flags,
                        *bufs[2:], terms)


def test_refuses_bad_input():
    moe = Moe(2, 8, 128, 256, 2, seed=1)
    parts, arrivals, act_q, act_s = moe.buffers()
    with pytest.raises(ValueError, match="xq needs at least 8 rows"):
        fp8_moe.gate_up(moe.xq, moe.sx, moe.gate, moe.gate_s, moe.up, moe.up_s, moe.sh_gate,
                        moe.sh_gate_s, moe.sh_up, moe.sh_up_s, moe.slot_expert, moe.num_slots,
                        parts, arrivals, act_q, act_s)
    with pytest.raises(ValueError, match="parts needs"):
        moe.gate_up(parts[:1], arrivals, act_q, act_s)
    with pytest.raises(ValueError, match="arrivals must be"):
        moe.gate_up(parts, arrivals[:-1], act_q, act_s)
    with pytest.raises(ValueError, match="intermediate"):
        fp8_moe.Fp8ExpertsMma(fp8_moe.GATE_UP, 1, 192, 256, 4)
    with pytest.raises(ValueError, match="1..16 rows"):
        fp8_moe.Fp8ExpertsMma(fp8_moe.DOWN, 17, 128, 256, 4)
    terms = torch.empty(2, 3, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="act_q must be"):
        moe.down_into(act_q[:-1], act_s, terms)
