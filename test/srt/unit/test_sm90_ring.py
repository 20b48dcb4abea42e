"""The CuTe DSL ring's schedule (``sgl_kernel_ext.nvidia.sm90.ring``), on CPU with Python ints:
the order the producer warp loads a CTA's slots in, the consumer warpgroup each goes to, and
the ring slot and mbarrier phase both sides use. The property that matters on the GPU: each
ring slot is used by one consumer warpgroup only, lap after lap (an mbarrier's parity wait only
tells a phase from the one before; slots shared by turns faulted fp8_moe on an H200 before
b8d704c). Also fp8_moe's K split, chosen on the device, and its partials' size."""

import itertools

import pytest

pytest.importorskip("cutlass.cute", reason="CuTe DSL (nvidia-cutlass-dsl) is not installed")

from sgl_kernel_ext.nvidia.sm90 import fp8_moe, ring  # noqa: E402


def _producer_order(groups, chunk, my_units, per):
    """[(unit, slot in unit, consumer, own count, ring index, phase)] in load order."""
    out = []
    for f in range(my_units * chunk):
        k, g_in, c, own = ring.round_slot(f, groups, chunk, my_units)
        st = ring.ring_state(groups * per, per, c, own, True)
        out.append((k, g_in, c, own, st.index, st.phase))
    return out


def _consumer_order(groups, chunk, my_units, per, c):
    """What consumer warpgroup c waits for, in its order (the kernels' consumer loop)."""
    out = []
    for rnd in range(-(-my_units // groups)):
        in_round = min(groups, my_units - rnd * groups)
        if c < in_round:
            for s in range(chunk):
                st = ring.ring_state(groups * per, per, c, rnd * chunk + s, False)
                out.append((rnd * groups + c, s, st.index, st.phase))
    return out


# (consumer warpgroups, slots a unit, units of the CTA, ring slots a warpgroup)
CASES = list(itertools.product([1, 2, 3], [1, 3], [0, 1, 2, 3, 5, 7], [1, 2, 5]))


def test_each_ring_slot_serves_one_consumer_lap_after_lap():
    for case in CASES:
        _check_schedule(*case)


def _check_schedule(groups, chunk, my_units, per):
    loads = _producer_order(groups, chunk, my_units, per)
    assert sorted((k, g) for k, g, *_ in loads) == [
        (k, g) for k in range(my_units) for g in range(chunk)], "every slot of every unit once"
    users = {}
    for c in range(groups):
        mine = [x for x in loads if x[2] == c]
        assert all(k % groups == c for k, *_ in mine), "units go to warpgroups round-robin"
        assert [own for _, _, _, own, _, _ in mine] == list(range(len(mine))), \
            "a warpgroup's slots are loaded in its own order"
        waits = _consumer_order(groups, chunk, my_units, per, c)
        assert [(k, g, i) for k, g, _, _, i, _ in mine] == [(k, g, i) for k, g, i, _ in waits]
        for (_, _, _, own, index, put_phase), (_, _, _, get_phase) in zip(mine, waits):
            assert c * per <= index < (c + 1) * per, "its own part of the ring"
            assert get_phase == (own // per) % 2 and put_phase == 1 - get_phase
            users.setdefault(index, set()).add(c)
            # consecutive uses of a slot by its warpgroup are consecutive laps: the producer
            # waits for the empty phase of the use `per` before, which this warpgroup released
    assert all(len(u) == 1 for u in users.values()), "a ring slot shared by warpgroups"


def test_two_phases_continue_each_warpgroups_count():
    """fp8_moe.experts: a CTA's gate/up units (chunk_g slots each), then its down units
    (chunk_d each), one ring. A warpgroup's second-phase counts start at ring.owned(...) x
    chunk_g (its i-th down unit's slots at that + i x chunk_d), so its slots stay its own, in
    order, lap after lap across the phases."""
    for groups, chunk_g, chunk_d, units_g, units_d, per in itertools.product(
            [1, 2, 3], [1, 3], [1, 2, 5], [0, 1, 2, 5], [0, 1, 3, 4], [1, 3]):
        loads = [(c, own) for *_, c, own, _, _ in _producer_order(groups, chunk_g, units_g, per)]
        for f in range(units_d * chunk_d):
            _, _, c, own = ring.round_slot(f, groups, chunk_d, units_d)
            loads.append((c, own + ring.owned(c, groups, units_g) * chunk_g))
        for c in range(groups):
            mine = [own for cc, own in loads if cc == c]
            assert mine == list(range(len(mine))), (groups, chunk_g, chunk_d, units_g, c)
            start = ring.owned(c, groups, units_g) * chunk_g
            assert start == sum(1 for cc, own in loads[:units_g * chunk_g] if cc == c)
            consumer = [start + i * chunk_d + s for i in range(ring.owned(c, groups, units_d))
                        for s in range(chunk_d)]  # _down_phase's counts
            assert [own for own in mine if own >= start] == consumer


def test_pdl_prefill_is_each_warpgroups_first_lap():
    """fp8_mma loads the slots with own count < per before the wait: no more than a
    warpgroup's part holds, so the producer never waits on a slot before the wait."""
    for groups, chunk, my_units, per in CASES:
        loads = _producer_order(groups, chunk, my_units, per)
        for c in range(groups):
            first = [x for x in loads if x[2] == c and x[3] < per]
            assert len({index for *_, index, _ in first}) == len(first) <= per


@pytest.mark.parametrize("inter,hidden,units", [(256, 6144, 264), (128, 1024, 40),
                                                (384, 768, 528)])
def test_gate_up_split_and_its_partials(inter, hidden, units):
    kg, tiles = hidden // 128, inter // 64
    for slots in range(1, 130):
        split = fp8_moe.gate_up_split(slots, inter, hidden, units)
        assert kg % split == 0
        assert split == 1 or slots * tiles * split <= units
        better = [s for s in range(split + 1, kg + 1) if kg % s == 0 and slots * tiles * s <= units]
        assert not better, "the most chunks that fit"
    rows = fp8_moe.gate_up_parts_rows(129, inter, hidden, units)
    assert all(s * fp8_moe.gate_up_split(s, inter, hidden, units) <= rows for s in range(1, 130))


def test_experts_flags_say_what_a_launch_left():
    """fp8_moe.experts' flags between launches: all zero is healthy; its error word (a wait
    that gave up) or an uncleared flag is reported, in a view of the layer's shared buffer
    too (each view's last word its error word)."""
    import torch

    shared = torch.zeros(fp8_moe.flags_size(129, 256), dtype=torch.int32)
    assert fp8_moe.flags_problems(shared) == []
    fp8_moe.check_flags(shared)
    view = shared[:fp8_moe.flags_size(9, 256)]
    view[-1] = 1  # the error word of a 9-slot step
    problems = fp8_moe.flags_problems(shared)
    assert len(problems) == 1 and "gave up" in problems[0]
    assert f"[{view.numel() - 1}]" in problems[0], "names the word"
    with pytest.raises(RuntimeError, match="outputs are garbage"):
        fp8_moe.check_flags(view)
    shared.zero_()
    shared[3] = 2  # a ready flag not cleared
    assert "not cleared" in fp8_moe.flags_problems(shared)[0]


def _moe_args(m=3, slots=5, experts=4, inter=256, hidden=384, terms=9):
    """fp8_moe's host arguments at small shapes, on CPU, as ``gate_up`` / ``down`` take them."""
    import torch

    e4m3, f32 = torch.float8_e4m3fn, torch.float32
    z = torch.zeros
    nx = fp8_moe.x_rows(m)
    units = 2 * 132
    gu = dict(xq=z(nx + 3, hidden, dtype=e4m3), sx=z(m, hidden // 128),
              gate_q=z(experts, inter, hidden, dtype=e4m3),
              gate_s=z(experts, inter // 128, hidden // 128),
              up_q=z(experts, inter, hidden, dtype=e4m3),
              up_s=z(experts, inter // 128, hidden // 128),
              sh_gate_q=z(inter, hidden, dtype=e4m3), sh_gate_s=z(inter // 128, hidden // 128),
              sh_up_q=z(inter, hidden, dtype=e4m3), sh_up_s=z(inter // 128, hidden // 128),
              slot_expert=z(slots, dtype=torch.int32), num_slots=z(1, dtype=torch.int32),
              parts=z(fp8_moe.gate_up_parts_rows(slots, inter, hidden, units), m, 2 * inter),
              arrivals=z(slots * inter // 128, dtype=torch.int32),
              act_q=z(slots * nx, inter, dtype=e4m3), act_s=z(slots * m, inter // 128))
    dn = dict(act_q=gu["act_q"], act_s=gu["act_s"],
              down_q=z(experts, hidden, inter, dtype=e4m3),
              down_s=z(experts, hidden // 128, inter // 128),
              sh_down_q=z(hidden, inter, dtype=e4m3), sh_down_s=z(hidden // 128, inter // 128),
              slot_expert=gu["slot_expert"], num_slots=gu["num_slots"],
              slot_weight=z(slots, m, dtype=f32), slot_rank=z(slots, m, dtype=torch.int32),
              terms=z(m, terms, hidden, dtype=torch.bfloat16))
    return gu, dn, units


def test_fp8_moe_host_checks_pass_the_documented_shapes_and_name_each_refusal():
    """The checks gate_up, down and experts share: the documented arguments pass (xq trimmed
    to the MMA's rows), and each wrong one is refused by name."""
    import torch

    gu, dn, units = _moe_args()
    assert fp8_moe._gate_up_checked(**gu, units=units).shape[0] == fp8_moe.x_rows(3)
    fp8_moe._down_checked(**dn)
    # argument: (wrong value, what the refusal must say)
    wrong = {"sx": (gu["sx"].double(), "sx must"), "up_q": (gu["up_q"][:, :128], "up must"),
             "arrivals": (gu["arrivals"][1:], "arrivals must"),
             "act_s": (gu["act_s"][:-1], "act_s must"), "parts": (gu["parts"][:1], "parts needs")}
    for name, (bad, says) in wrong.items():
        with pytest.raises(ValueError, match=says):
            fp8_moe._gate_up_checked(**{**gu, name: bad}, units=units)
    wrong = {"slot_weight": (dn["slot_weight"].half(), "slot_weight must"),
             "down_s": (dn["down_s"][:, :1], "down scales must"),
             "terms": (dn["terms"].float(), "terms must"),
             "slot_rank": (dn["slot_rank"][:, :2], "slot_rank must")}
    for name, (bad, says) in wrong.items():
        with pytest.raises(ValueError, match=says):
            fp8_moe._down_checked(**{**dn, name: bad})
    with pytest.raises(ValueError, match="same strides"):
        fp8_moe._gate_up_checked(**{**gu, "up_q": torch.zeros(
            4, 512, 384, dtype=torch.float8_e4m3fn)[:, :256]}, units=units)
