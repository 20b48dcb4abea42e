"""benchmark/stream_chain_probe's layers at more rows (at_rows) and the attention side alone:
the bytes and parts each config streams, against the roofline's count of the same layer."""

import pytest

P = pytest.importorskip("benchmark.stream_chain_probe", reason="needs CuTe DSL (cutlass)")
from benchmark import roofline as RL  # noqa: E402


def _mb(config: str) -> float:
    return sum(st.mb for st in P.CONFIGS[config])


@pytest.mark.parametrize("rows", sorted(P.EXPERTS_AT))
def test_at_rows_scales_the_kv_rows_and_the_experts(rows):
    one, more = {st.name: st for st in P.LAYER}, {st.name: st for st in P.at_rows(P.LAYER, rows)}
    assert more["attention"].mb == pytest.approx(rows * one["attention"].mb)
    experts = P.EXPERTS_AT[rows] + 1  # and the shared one
    for name in ("gate_up", "down"):
        assert more[name].parts == experts
        assert more[name].mb == pytest.approx(one[name].mb / 9 * experts)
    assert {n: st for n, st in more.items() if n not in ("attention", "gate_up", "down")} == \
        {n: st for n, st in one.items() if n not in ("attention", "gate_up", "down")}
    dag = {st.name: st for st in P.at_rows(P.LAYER_DAG, rows)}
    assert dag["gate_up"].parts == dag["down"].parts == P.EXPERTS_AT[rows]


@pytest.mark.parametrize("rows", sorted(P.EXPERTS_AT))
def test_each_row_counts_layer_is_the_roofline_layer(rows):
    """The chain's bytes within 2% of benchmark.roofline's MoE layer with the same experts
    (which also counts the scales and the router's bf16 weights exactly)."""
    floor = RL.layer_bytes("moe", 8, rows, 2048, experts=P.EXPERTS_AT[rows]) / 1e6
    for config in (f"layer_{rows}", f"dag_{rows}"):
        assert _mb(config) == pytest.approx(floor, rel=0.02), config


def test_attention_side_is_the_layer_without_its_experts():
    side = {st.name for st in P.ATTN_SIDE_DAG}
    assert side == {"q_a|kv_a", "q_b", "absorb", "attention", "absorb_v", "o_proj", "router"}
    assert _mb("attn_dag_16") - _mb("attn_dag") == pytest.approx(15 * 2.36)
