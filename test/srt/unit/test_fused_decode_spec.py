"""The fused path's refusal reasons, as plain values (no upstream involved)."""

from sglang.srt.layers.fused_decode import spec

GLM5 = spec.Setup(architectures=("GlmMoeDsaForCausalLM",))


def test_off_serves_anything():
    assert spec.refusal_reasons("off", spec.Setup(architectures=("LlamaForCausalLM",))) == []


def test_unknown_backend_is_named():
    (reason,) = spec.refusal_reasons("cuda_magic", GLM5)
    assert "cuda_magic" in reason and "off" in reason


def test_every_reason_is_listed_at_once():
    setup = spec.Setup(
        architectures=("LlamaForCausalLM",),
        other_kernel_flags=("--enable-nvidia-megakernel",),
    )
    reasons = spec.refusal_reasons("triton", setup)
    assert len(reasons) == 3
    assert "LlamaForCausalLM" in reasons[0]
    assert "'triton'" in reasons[1]
    assert "--enable-nvidia-megakernel" in reasons[2]


def test_unbuilt_implementations_refuse_by_name():
    for impl in spec.IMPLEMENTATIONS:
        if impl not in spec.BUILT_IMPLEMENTATIONS:
            assert any(repr(impl) in r for r in spec.refusal_reasons(impl, GLM5))


def test_only_unverified_kernels_are_usable_on_request():
    """The opt-in serves implementations with kernels not yet verified end to end, never one
    without kernels, never through auto."""
    on = {spec.UNVERIFIED_ENV: "1"}
    assert spec.UNVERIFIED_IMPLEMENTATIONS <= set(spec.IMPLEMENTATIONS)
    for impl in spec.IMPLEMENTATIONS:
        if impl in spec.BUILT_IMPLEMENTATIONS:
            continue
        assert not spec.usable(impl, {})
        assert spec.usable(impl, on) == (impl in spec.UNVERIFIED_IMPLEMENTATIONS)
    assert spec.usable(spec.AUTO, on) == bool(spec.BUILT_IMPLEMENTATIONS)
    assert not spec.usable("triton", {spec.UNVERIFIED_ENV: "true"})  # exactly "1"


def test_choices_are_off_auto_then_one_per_extension_implementation():
    import sgl_kernel_ext

    assert spec.BACKEND_CHOICES[:2] == ("off", "auto")
    assert set(spec.IMPLEMENTATIONS) == set(sgl_kernel_ext.IMPLEMENTATIONS)
