"""--fused-decode-backend through the installed upstream's CLI and argument pipeline."""

import logging
import subprocess
import sys

import pytest

from model_dirs import write_model_dir
from sglang.srt.layers.fused_decode import spec

pytest.importorskip("sglang.srt.server_args", reason="upstream SGLang is not installed")


def _args(model_dir, *extra):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", str(model_dir), "--device", "cpu", *extra])


def _resolved(model_dir, *extra):
    server_args = _args(model_dir, *extra)
    server_args.resolve_once()
    return server_args


def test_launch_server_help_lists_the_flag():
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--fused-decode-backend {" + ",".join(spec.BACKEND_CHOICES) + "}" in out.stdout


@pytest.mark.parametrize("value", spec.BACKEND_CHOICES)
def test_every_choice_parses(tiny_glm5_dir, value):
    assert _args(tiny_glm5_dir, "--fused-decode-backend", value).fused_decode_backend == value


def test_default_is_off_and_unknown_values_are_refused(tiny_glm5_dir, capsys):
    assert _args(tiny_glm5_dir).fused_decode_backend == "off"
    with pytest.raises(SystemExit):
        _args(tiny_glm5_dir, "--fused-decode-backend", "fastest")
    assert "invalid choice: 'fastest'" in capsys.readouterr().err


def test_off_changes_nothing(tiny_glm5_dir, hopper_capability):
    default = _resolved(tiny_glm5_dir, "--random-seed", "7")
    off = _resolved(tiny_glm5_dir, "--random-seed", "7", "--fused-decode-backend", "off")
    assert off.resolved_dict() == default.resolved_dict()
    assert off.resolved_dict()["fused_decode_backend"] == "off"
    sources = [source for source, _ in getattr(off, "_resolved_overrides", None) or ()]
    assert not any("fused_decode" in s for s in sources)


def test_auto_logs_reasons_and_resolves_to_off(tiny_glm5_dir, hopper_capability, caplog):
    from sglang.srt.arg_groups.model_override_base import resolved_view

    hooks_logger = logging.getLogger("sglang.srt.models.glm5_mega.hooks")
    hooks_logger.addHandler(caplog.handler)  # upstream's logging setup stops propagation
    try:
        server_args = _resolved(tiny_glm5_dir, "--fused-decode-backend", "auto")
    finally:
        hooks_logger.removeHandler(caplog.handler)
    assert resolved_view(server_args).fused_decode_backend == "off"
    assert "--fused-decode-backend auto: no fused decode implementation" in caplog.text


def test_named_implementation_refuses_with_every_reason(tmp_path, hopper_capability):
    model_dir = write_model_dir(tmp_path / "m", architectures=["DeepseekV3ForCausalLM"])
    with pytest.raises(ValueError) as refused:
        _resolved(model_dir, "--fused-decode-backend", "triton")
    message = str(refused.value)
    assert message.startswith("--fused-decode-backend triton cannot run this setup:")
    assert "architecture ['DeepseekV3ForCausalLM'] is not served" in message
    assert "implementation 'triton' has not run end to end" in message
