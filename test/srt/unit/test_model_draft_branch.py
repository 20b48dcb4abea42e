"""The fork's GLM-5.3 MTP draft forward: the branch rule (forward mode and row count only),
dispatch to upstream's forward when off or uncovered, a carried top-k without carry buffers
refused, and the reasons ``spec.draft_reasons`` gives (the draft alone is refused; the setup
stays served; GLM-5.3's ``index_share_for_mtp_iteration`` is no reason)."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.fused_decode import draft, plan as fused_plan, spec
from sglang.srt.layers.fused_decode.reference.config import glm53_config

pytest.importorskip("sglang.srt.models.glm4_moe", reason="upstream SGLang is not installed")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.models import glm4_moe  # noqa: E402
from sglang.srt.models.glm5_mega import glm5, hooks  # noqa: E402

from branch_dispatch import bare, recorded_model  # noqa: E402

EAGLE = {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 4}


def _state():
    plan = fused_plan.Plan(cfg=None, widths=spec.draft_widths(), layer_ids=[], layers=[],
                           max_rows=16, max_context=64, role="MTP draft")
    return glm5.FusedState(plan, [], 1, reduce=lambda y: y, draft=object())


def _fb(mode, **kw):
    return SimpleNamespace(forward_mode=mode, spec_info=None, **kw)


@pytest.mark.parametrize("mode", list(ForwardMode), ids=lambda m: m.name)
def test_draft_branch_rule_per_mode_and_rows(mode):
    covered = [r for r in range(0, 40) if glm5.fused_mode(_state(), _fb(mode), r)]
    assert covered == (list(range(1, 17)) if mode.is_decode() else [])


def _draft_model():
    return bare(glm5.GlmMoeDsaForCausalLMNextN)


def test_draft_forward_dispatch(monkeypatch):
    model, calls = recorded_model(monkeypatch, glm5.GlmMoeDsaForCausalLMNextN,
                                  glm4_moe.GlmMoeDsaForCausalLMNextN)
    ids, pos, fb = torch.zeros(3, dtype=torch.long), torch.arange(3), _fb(ForwardMode.DECODE)

    assert model.forward(ids, pos, fb) == "upstream-out"  # off: no plan on the model
    assert calls == [("upstream", (ids, pos, fb, None))]
    model.__dict__[glm5.STATE_KEY] = _state()
    assert model.forward(ids, pos, fb) == ("logits", "h", "head")
    assert calls[-1] == ("fused", "decode")
    for mode in (ForwardMode.DRAFT_EXTEND_V2, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE):
        assert model.forward(ids, pos, _fb(mode)) == "upstream-out"
    wide = torch.zeros(17, dtype=torch.long)
    assert model.forward(wide, torch.arange(17), fb) == "upstream-out"
    assert model.forward(ids, pos, fb, pp_proxy_tensors=object()) == "upstream-out"


def test_a_step_carrying_a_topk_needs_the_carry_buffers():
    model = _draft_model()
    fb = _fb(ForwardMode.DECODE, reuse_dsa_topk_indices=True)
    with pytest.raises(RuntimeError, match="without its carry buffers"):
        model._fused_forward(_state(), "decode", torch.zeros(2, dtype=torch.long),
                             torch.arange(2), fb)


def test_eh_hidden_is_the_normalized_halves_projected():
    g = torch.Generator().manual_seed(0)
    h = 128
    e, p = torch.randn(3, h, generator=g).bfloat16(), torch.randn(3, h, generator=g).bfloat16()
    we, wh = torch.rand(h, generator=g).bfloat16(), torch.rand(h, generator=g).bfloat16()
    w = (torch.randn(h, 2 * h, generator=g) / 16).bfloat16()
    out = draft.eh_hidden(e, p, we, wh, w, 1e-5)
    def norm(x, wt):
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * wt.float()).bfloat16()

    expected = torch.cat((norm(e, we), norm(p, wh)), -1).float() @ w.float().T
    assert out.dtype == torch.bfloat16 and out.shape == (3, h)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="hidden states handed over"):
        draft.eh_hidden(e, p[:2], we, wh, w, 1e-5)


def _setup(args=EAGLE, **hf):
    return spec.Setup(architectures=(spec.TARGET_ARCHITECTURE,), server_args=dict(args),
                      hf_config={**glm53_config().to_dict(), **hf})


def test_draft_reasons():
    assert spec.draft_reasons(_setup({})) == []  # no speculation: no draft
    # GLM-5.3 carries one top-k across its draft steps: the fused draft attends it
    assert _setup().hf_config["index_share_for_mtp_iteration"] is True
    assert spec.draft_reasons(_setup()) == []
    assert spec.draft_reasons(_setup(index_share_for_mtp_iteration=False)) == []
    args = {**EAGLE, "speculative_moe_runner_backend": "deep_gemm",
            "speculative_draft_kv_cache_dtype": "fp8_e4m3", "speculative_draft_window_size": 512,
            "enable_multi_layer_eagle": True}
    reasons = spec.draft_reasons(_setup(args, index_share_for_mtp_iteration=False))
    starts = ["--speculative-moe-runner-backend deep_gemm",
              "--speculative-draft-kv-cache-dtype fp8_e4m3",
              "--speculative-draft-window-size 512", "--enable-multi-layer-eagle"]
    assert [r.split(":")[0] for r in reasons] == starts, reasons


def test_draft_reasons_do_not_refuse_the_setup(monkeypatch):
    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset({"triton"}))
    setup = _setup({**EAGLE, "speculative_draft_kv_cache_dtype": "fp8_e4m3"})
    assert len(spec.draft_reasons(setup)) == 1
    assert spec.refusal_reasons("triton", setup) == []
    assert spec.refusal_reasons("auto", setup) == []


def test_resolution_serves_glm53_with_its_draft_fused(tmp_path, hopper_capability,
                                                                 monkeypatch, caplog):
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.server_args import prepare_server_args

    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset({"triton"}))
    path = tmp_path / "glm53"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(glm53_config().to_dict()))
    log = logging.getLogger(hooks.__name__)
    log.addHandler(caplog.handler)  # upstream's logging setup stops propagation
    try:
        server_args = prepare_server_args([
            "--model-path", str(path), "--device", "cuda", "--tp", "8",
            "--fused-decode-backend", "triton", "--speculative-algorithm", "EAGLE",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"])
        server_args.resolve_once()
    finally:
        log.removeHandler(caplog.handler)
    assert resolved_view(server_args).fused_decode_backend == "triton"
    # GLM-5.3's real config (index_share_for_mtp_iteration) with EAGLE: the draft fuses too
    lines = [r.getMessage() for r in caplog.records if "MTP draft" in r.getMessage()]
    assert lines == []


def test_install_on_a_draft_is_a_no_op_when_off(monkeypatch):
    monkeypatch.setattr(hooks, "fused_decode_backend", lambda: "off")
    model = _draft_model()
    hooks.install_fused_decode(model=model, hf_config=None, capture_tail_hooks=[],
                               is_draft=True)
    assert glm5.STATE_KEY not in model.__dict__


def test_install_leaves_other_drafts_on_upstream(monkeypatch):
    monkeypatch.setattr(hooks, "fused_decode_backend", lambda: "triton")
    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset({"triton"}))
    target = glm5.GlmMoeDsaForCausalLM.__new__(glm5.GlmMoeDsaForCausalLM)
    torch.nn.Module.__init__(target)
    hooks.install_fused_decode(model=target, hf_config=None, capture_tail_hooks=[],
                               is_draft=True)  # a target class on a draft runner: not served
    assert glm5.STATE_KEY not in target.__dict__
