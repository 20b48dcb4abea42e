"""The fork's GLM-5.3 forward: its signature, the branch rule (forward mode and row count
only), and that uncovered steps and ``off`` run upstream's forward unchanged."""

import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.fused_decode import plan as fused_plan, runtime, spec

pytest.importorskip("sglang.srt.models.glm4_moe", reason="upstream SGLang is not installed")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.models import glm4_moe  # noqa: E402
from sglang.srt.models.glm5_mega import glm5, hooks  # noqa: E402

from branch_dispatch import bare, recorded_model  # noqa: E402


def _state(speculative=None, draft_tokens=None):
    widths = spec.covered_widths(speculative, draft_tokens)
    plan = fused_plan.Plan(cfg=None, widths=widths, layer_ids=[], layers=[], max_rows=16,
                           max_context=64)
    return glm5.FusedState(plan, [], draft_tokens or 1, reduce=lambda y: y)


def _fb(mode):
    return SimpleNamespace(forward_mode=mode, spec_info=None)


def test_forward_signature_is_upstreams():
    for cls in (glm5.GlmMoeDsaForCausalLM, glm5.GlmMoeDsaForCausalLMNextN):
        upstream = getattr(glm4_moe, cls.__name__)
        assert inspect.signature(cls.forward).parameters.keys() == \
            inspect.signature(upstream.forward).parameters.keys()
        defaults = lambda f: [(p.name, p.default, p.kind)  # noqa: E731
                              for p in inspect.signature(f).parameters.values()]
        assert defaults(cls.forward) == defaults(upstream.forward)


@pytest.mark.parametrize("mode", list(ForwardMode), ids=lambda m: m.name)
def test_branch_rule_per_mode_and_rows(mode):
    state = _state("EAGLE", 4)
    covered = [r for r in range(0, 40) if glm5.fused_mode(state, _fb(mode), r)]
    if mode.is_decode():
        assert covered == list(range(1, 17))
    elif mode.is_target_verify():
        assert covered == [4, 8, 12, 16]
    else:
        assert covered == []


def test_no_plan_embeds_or_pp_proxies_run_upstream():
    state = _state()
    decode = _fb(ForwardMode.DECODE)
    assert glm5.fused_mode(None, decode, 4) is None
    assert glm5.fused_mode(state, decode, 4, input_embeds=torch.zeros(4, 8)) is None
    assert glm5.fused_mode(state, decode, 4, pp_proxy_tensors=object()) is None
    assert glm5.fused_mode(state, decode, 4) == "decode"
    assert glm5.fused_mode(state, _fb(ForwardMode.TARGET_VERIFY), 4) is None  # no speculation


def _model():
    return bare(glm5.GlmMoeDsaForCausalLM)


def test_forward_dispatch(monkeypatch):
    model, calls = recorded_model(monkeypatch, glm5.GlmMoeDsaForCausalLM,
                                  glm4_moe.GlmMoeDsaForCausalLM)
    ids, pos, fb = torch.zeros(3, dtype=torch.long), torch.arange(3), _fb(ForwardMode.DECODE)

    assert model.forward(ids, pos, fb) == "upstream-out"  # off: no plan on the model
    assert calls == [("upstream", (ids, pos, fb, None, None))]
    model.__dict__[glm5.STATE_KEY] = _state()
    assert model.forward(ids, pos, fb) == ("logits", "h", "head")
    assert calls[-1] == ("fused", "decode")
    assert model.forward(ids, pos, _fb(ForwardMode.EXTEND)) == "upstream-out"
    wide = torch.zeros(17, dtype=torch.long)
    assert model.forward(wide, torch.arange(17), fb) == "upstream-out"


def test_install_is_a_no_op_when_off_and_refuses_a_bypass(monkeypatch):
    monkeypatch.setattr(hooks, "fused_decode_backend", lambda: "off")
    hooks.install_fused_decode(model=_model(), hf_config=None, capture_tail_hooks=[],
                               is_draft=False)
    monkeypatch.setattr(hooks, "fused_decode_backend", lambda: "nvidia_sm90")
    with pytest.raises(RuntimeError, match="no fused decode plan"):
        hooks.install_fused_decode(model=_model(), hf_config=None, capture_tail_hooks=[],
                                   is_draft=False)


def test_step_rows_verify_and_padding():
    r2t = torch.arange(5 * 8, dtype=torch.int32).view(5, 8)
    rows = runtime.step_rows(torch.tensor([3, 4, 6, 7]), r2t, torch.tensor([2, 4]), 2, 6,
                             num_real_rows=torch.tensor(3))
    assert rows.positions.tolist() == [3, 4, 6, -1]
    # the kernels read req_to_token in place: a view, and each row's request row
    assert rows.slot_table.data_ptr() == r2t.data_ptr() and rows.slot_table.shape == (5, 6)
    assert rows.slot_rows.dtype == torch.int64 and rows.slot_rows.tolist() == [2, 2, 4, 4]
    # the reference's [rows, width] table (check mode) as before
    assert rows.token_slots.dtype == torch.int64 and rows.token_slots.shape == (4, 6)
    assert rows.token_slots[:, 0].tolist() == [16, 16, 32, 32]


def test_pool_caches_refuse_other_layouts():
    ok = runtime.pool_caches({0: torch.zeros(128, 1, 192, dtype=torch.bfloat16)},
                             {0: torch.zeros(2, 64 * 132, dtype=torch.uint8)}, 192)
    assert ok.kv[0].shape == (128, 192)
    with pytest.raises(ValueError, match="raw bf16"):  # the FP8 pool's scaled rows
        runtime.pool_caches({0: torch.zeros(128, 1, 656, dtype=torch.uint8)}, {}, 192)
    with pytest.raises(ValueError, match="uint8 pages"):  # pooled (kpool) index pages
        runtime.pool_caches({}, {0: torch.zeros(2, 4 * 132, dtype=torch.uint8)}, 192)
