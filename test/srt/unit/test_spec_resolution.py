"""The served setups and refusal reasons of --fused-decode-backend, through the installed
upstream's argument pipeline (a GLM-5.3 config.json at real shapes; no weights load)."""

import json
import logging

import pytest

from sglang.srt.layers.fused_decode import spec
from sglang.srt.layers.fused_decode.reference.config import glm53_config

pytest.importorskip("sglang.srt.server_args", reason="upstream SGLang is not installed")

EAGLE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


def _model_dir(tmp_path, **changes):
    d = {**glm53_config().to_dict(), **changes}
    for key in [k for k, v in changes.items() if v is None]:
        d.pop(key)
    path = tmp_path / "glm53"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(d))
    return path


def _resolve(model_dir, *extra, backend="triton"):
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args([
        "--model-path", str(model_dir), "--device", "cuda", "--tp", "8",
        "--fused-decode-backend", backend, *extra,
    ])
    server_args.resolve_once()
    return resolved_view(server_args)


def _reasons(model_dir, *extra):
    with pytest.raises(ValueError) as refused:
        _resolve(model_dir, *extra)
    head, *reasons = str(refused.value).split("\n  - ")
    assert head == "--fused-decode-backend triton cannot run this setup:"
    return reasons


@pytest.fixture
def triton_built(monkeypatch):
    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset({"triton"}))


@pytest.mark.parametrize("extra", [(), EAGLE], ids=["decode", "eagle-3-1-4"])
def test_glm53_fp8_tp8_is_served(tmp_path, hopper_capability, triton_built, extra):
    view = _resolve(_model_dir(tmp_path), *extra)
    assert view.fused_decode_backend == "triton"
    assert view.kv_cache_dtype in spec.SERVED_KV_DTYPES and view.page_size == 64


def test_unverified_implementation_is_the_only_reason(tmp_path, hopper_capability, monkeypatch):
    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset())
    monkeypatch.delenv(spec.UNVERIFIED_ENV, raising=False)
    assert _reasons(_model_dir(tmp_path)) == [
        "implementation 'triton' has not run end to end through a server yet; "
        f"{spec.UNVERIFIED_ENV}=1 serves it anyway (for that run, test/srt/e2e)"]


@pytest.mark.parametrize("extra", [(), EAGLE], ids=["decode", "eagle-3-1-4"])
def test_unverified_implementation_is_served_on_request_with_a_warning(
        tmp_path, hopper_capability, monkeypatch, caplog, extra):
    """With SGLANG_FUSED_DECODE_UNVERIFIED=1 the kernels that have not run end to end are
    served by name (the e2e run needs them), warning so; auto still runs upstream's path, and
    a name without kernels still refuses."""
    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset())
    monkeypatch.setenv(spec.UNVERIFIED_ENV, "1")
    hooks_logger = logging.getLogger("sglang.srt.models.glm5_mega.hooks")
    hooks_logger.addHandler(caplog.handler)
    try:
        view = _resolve(_model_dir(tmp_path), *extra)
        auto = _resolve(_model_dir(tmp_path), *extra, backend="auto")
    finally:
        hooks_logger.removeHandler(caplog.handler)
    assert view.fused_decode_backend == "triton" and auto.fused_decode_backend == "off"
    assert "has not run end to end through a server yet" in caplog.text
    with pytest.raises(ValueError, match="'nvidia_sm90' has no kernels in this build"):
        _resolve(_model_dir(tmp_path), *extra, backend="nvidia_sm90")


def test_every_unserved_argument_is_named_at_once(tmp_path, hopper_capability, triton_built):
    reasons = _reasons(
        _model_dir(tmp_path), "--kv-cache-dtype", "fp8_e4m3", "--pp-size", "2",
        "--moe-runner-backend", "deep_gemm", "--enable-torch-compile",
        "--enable-return-routed-experts", "--enable-lora", "--ep", "8",
    )
    expected = ["--kv-cache-dtype fp8_e4m3", "--pp 2", "--moe-runner-backend deep_gemm",
                "--enable-torch-compile", "--enable-return-routed-experts", "--enable-lora",
                "--ep 8"]
    for text in expected:
        assert sum(r.startswith(text) for r in reasons) == 1, (text, reasons)
    assert len(reasons) == len(expected)


@pytest.mark.parametrize("extra, starts", [
    (("--enable-dp-attention", "--dp", "2"), "--attn-dp-size 2"),
    (("--attention-backend", "flashinfer"), "--attention-backend flashinfer"),
    (("--cuda-graph-backend-decode", "breakable"), "decode CUDA graph backend breakable"),
    (("--enable-hierarchical-cache",), "--enable-hierarchical-cache"),
    (("--enable-hisparse",), "--enable-hisparse"),
    (("--enable-return-indexer-topk",), "--enable-return-indexer-topk"),
])
def test_more_unserved_arguments(tmp_path, hopper_capability, triton_built, extra, starts):
    reasons = _reasons(_model_dir(tmp_path), *extra)
    assert any(r.startswith(starts) for r in reasons), reasons


def test_ragged_verify_is_refused(tmp_path, hopper_capability, triton_built, monkeypatch):
    monkeypatch.setenv(spec.RAGGED_VERIFY_ENV, "compact")
    (reason,) = _reasons(_model_dir(tmp_path), *EAGLE)
    assert reason.startswith(f"{spec.RAGGED_VERIFY_ENV}=compact")


def test_check_mode_needs_eager_decode(tmp_path, hopper_capability, triton_built, monkeypatch):
    monkeypatch.setenv(spec.CHECK_ENV, "1")
    (reason,) = _reasons(_model_dir(tmp_path))
    assert reason.startswith(f"{spec.CHECK_ENV} is set: check mode is eager only")
    assert _resolve(_model_dir(tmp_path), "--disable-cuda-graph").fused_decode_backend == "triton"


@pytest.mark.parametrize("changes, starts", [
    ({"indexer_rope_interleave": None}, "config indexer_rope_interleave=False"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                          "original_max_position_embeddings": 4096}}, "config rope_type='yarn'"),
    ({"index_k_norm_type": "rms"}, "config index_k_norm_type='rms'"),
    ({"num_attention_heads": 60, "num_key_value_heads": 60}, "config: tp_size=8 does not split"),
])
def test_config_assumptions_are_checked(tmp_path, hopper_capability, triton_built, changes, starts):
    reasons = _reasons(_model_dir(tmp_path, **changes))
    assert any(r.startswith(starts) for r in reasons), reasons


def test_auto_logs_each_reason_and_resolves_off(tmp_path, hopper_capability, triton_built, caplog):
    hooks_logger = logging.getLogger("sglang.srt.models.glm5_mega.hooks")
    hooks_logger.addHandler(caplog.handler)  # upstream's logging setup stops propagation
    try:
        view = _resolve(_model_dir(tmp_path), "--kv-cache-dtype", "fp8_e4m3", "--pp-size", "2",
                        backend="auto")
    finally:
        hooks_logger.removeHandler(caplog.handler)
    assert view.fused_decode_backend == "off"
    lines = [r.getMessage() for r in caplog.records if "auto:" in r.getMessage()]
    assert len(lines) == 2 and all(line.endswith("decode runs upstream's path") for line in lines)


def test_flash_resolves_but_is_refused_cleanly(monkeypatch):
    monkeypatch.setattr(spec, "BUILT_IMPLEMENTATIONS", frozenset({"triton"}))
    setup = spec.Setup(architectures=(spec.FLASH_ARCHITECTURE,), server_args={"tp_size": 4})
    reasons = spec.refusal_reasons("triton", setup)
    assert len(reasons) == 1 and "GLM-5.3-Flash" in reasons[0]


def test_covered_widths():
    assert spec.covered_widths(None, None) == {"decode": tuple(range(1, 17)), "target_verify": ()}
    assert spec.covered_widths("EAGLE", 4)["target_verify"] == (4, 8, 12, 16)
    assert spec.covered_widths("NEXTN", 6)["target_verify"] == (6, 12)
