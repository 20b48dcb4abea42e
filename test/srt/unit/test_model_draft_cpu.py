"""The fork's GLM-5.3 MTP draft class built by upstream's loader on CPU (as an EAGLE draft
worker loads it) from the reference's tiny checkpoint, its fused draft-decode steps run through
``forward`` on upstream's own one-layer DSA pool, ReqToTokenPool, ForwardBatch, EagleDraftInput
and logits processor (Triton interpreter), compared with the reference draft step.

The model is built and run once, in a subprocess (``glm5_cpu_draft.py``), for the reasons
``test_model_fused_cpu.py`` gives. Each step runs in check mode, so the reference also runs
beside the draft's fused layer. GLM-5.3's ``index_share_for_mtp_iteration`` stays on: two draft
loops carry one top-k across their iterations as upstream's EAGLE worker does (one seeded by
draft-extend's top-k as physical slots, one unseeded), each iteration compared with the
reference attending the same carried top-k.
"""


import pytest

from cpu_script import run_script
from sglang.srt.layers.fused_decode.spec import NUMERICS

pytest.importorskip("sglang.srt.model_loader", reason="upstream SGLang is not installed")

TOL = NUMERICS["fused_layer_interpreter"]
STEP_KL = 0.05  # as test_model_fused_cpu.py: two correct implementations of this tiny model


CPU_SCRIPT = "glm5_cpu_draft.py"  # started when collection ends (conftest)


@pytest.fixture(scope="module")
def run():
    return run_script(CPU_SCRIPT)


def test_draft_architecture_builds_the_fork_class(run):
    assert run["architectures"] == ["GlmMoeDsaForCausalLMNextN"]
    assert run["model_class"] == "sglang.srt.models.glm5_mega.glm5.GlmMoeDsaForCausalLMNextN"
    assert run["missing_attributes"] == []  # upstream_reads' draft-side attributes exist


def test_draft_weights_are_the_checkpoints(run):
    assert run["adapt_reasons"] == [] and run["weights_mismatched"] == []


def test_install_builds_the_draft_plan(run):
    assert run["index_share"] is True  # GLM-5.3's config: the draft carries one top-k
    assert run["install_log"] == []
    assert run["widths"] == {"decode": list(range(1, 17))}
    assert run["describe"].startswith("fused decode covers decode 1-16 rows on 1 MTP draft layer")
    assert run["pool_ids"] == {"4": 0}  # the tiny model's draft layer is the pool's layer 0


def test_draft_branch_decision_by_mode_and_rows(run):
    for mode, rows in run["branch_log"].items():
        assert rows == (list(range(1, 17)) if mode == "DECODE" else []), mode


def test_input_path_matches_upstreams_modules_and_the_reference(run):
    assert run["eh_vs_upstream_rel"] == 0.0  # upstream's enorm / hnorm / eh_proj on CPU
    assert run["eh_vs_reference_rel"] == 0.0


LOOPS = [f"{name}{i}" for name in ("seeded", "unseeded") for i in range(3)]


@pytest.mark.parametrize("step", ["step1", "step2"] + LOOPS)
def test_fused_draft_step_matches_the_reference(run, step):
    r = run[step]
    assert r["check_lines"] == [], r["check_lines"]  # check mode: nothing outside NUMERICS
    (errors,) = r["check_errors"]  # one layer
    assert errors["y_rel"] <= TOL["y_rel"] and errors["residual_rel"] <= TOL["residual_rel"]
    assert errors["kv_written_rel"] <= TOL["kv_written_rel"]
    assert errors["topk_overlap"] >= TOL["topk_overlap"]
    assert errors["routing_flips"] <= TOL["max_routing_flips"]
    assert r["kl_max"] <= STEP_KL, r
    # the same token, or a near-tie: the reference's own margin between the two choices is
    # within the step's measured logits error (the tiny random model has near-ties)
    assert r["argmax_equal"] or r["argmax_gap_rel"] <= r["logits_rel"], r
    assert r["hidden_rel"] <= TOL["y_rel"], r  # the hidden state the next draft step takes
    assert r["kv_written_rel"] <= TOL["kv_written_rel"], r
    assert r["kv_untouched_bitwise"] and r["index_untouched_pages_bitwise"], r


def test_plain_steps_run_the_indexer(run):
    for step in ("step1", "step2"):
        r = run[step]
        assert r["indexer_ran"] and r["scores_written"] and not r["index_untouched_bitwise"]
        assert r["carry"] is None


def test_a_seeded_loop_attends_draft_extends_topk_in_every_iteration(run):
    """Upstream seeds GLM-5.3's draft loop from draft-extend: no iteration runs the indexer;
    the seed (physical slots in any order) is carried as its ascending context positions."""
    for i in range(3):
        r = run[f"seeded{i}"]
        assert not r["indexer_ran"] and not r["scores_written"], i
        assert r["index_untouched_bitwise"], i  # no index-K row written
        assert r["carry"] == r["expected_carry"] == run["seed_positions"], i


def test_an_unseeded_loop_reuses_its_first_iterations_topk(run):
    first = run["unseeded0"]
    assert first["indexer_ran"] and first["scores_written"]
    assert not first["index_untouched_bitwise"]  # its index-K rows are written
    for i in (1, 2):
        r = run[f"unseeded{i}"]
        assert not r["indexer_ran"] and not r["scores_written"], i
        assert r["index_untouched_bitwise"], i
        assert r["carry"] == first["carry"], i


def test_every_step_ran_fused(run):
    assert run["steps_counted"] == 2 + len(LOOPS)
