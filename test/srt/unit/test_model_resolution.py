"""The GLM-5.x architectures resolve to the fork's classes; every other one stays upstream's."""

import pytest

pytest.importorskip("sglang.srt.models.registry", reason="upstream SGLang is not installed")

FORK_CLASSES = {
    "GlmMoeDsaForCausalLM": "sglang.srt.models.glm5_mega.glm5",
    "GlmMoeDsaForCausalLMNextN": "sglang.srt.models.glm5_mega.glm5",
    "Glm5NextForConditionalGeneration": "sglang.srt.models.glm5_mega.glm5_flash",
}


@pytest.fixture(scope="module")
def registry():
    from sglang.srt.models.registry import ModelRegistry

    return ModelRegistry


@pytest.mark.parametrize("arch", sorted(FORK_CLASSES))
def test_glm5_architectures_resolve_to_fork_classes(registry, arch):
    import importlib

    cls, resolved = registry.resolve_model_cls([arch])
    assert resolved == arch and cls.__name__ == arch
    assert cls.__module__ == FORK_CLASSES[arch]
    upstream_module = {
        "GlmMoeDsaForCausalLM": "sglang.srt.models.glm4_moe",
        "GlmMoeDsaForCausalLMNextN": "sglang.srt.models.glm4_moe",
        "Glm5NextForConditionalGeneration": "sglang.srt.models.glm5_next",
    }[arch]
    assert issubclass(cls, getattr(importlib.import_module(upstream_module), arch))


@pytest.mark.parametrize(
    "arch, module",
    [
        ("DeepseekV3ForCausalLM", "sglang.srt.models.deepseek_v2"),
        ("Glm4MoeForCausalLM", "sglang.srt.models.glm4_moe"),
        ("LlamaForCausalLM", "sglang.srt.models.llama"),
    ],
)
def test_other_architectures_stay_upstream(registry, arch, module):
    cls, _ = registry.resolve_model_cls([arch])
    assert cls.__module__ == module
