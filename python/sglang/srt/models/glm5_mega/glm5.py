"""GLM-5.3 (``GlmMoeDsaForCausalLM``) and its MTP draft (``GlmMoeDsaForCausalLMNextN``).

These are the classes the architectures resolve to in the fork. They are upstream's
classes, unchanged, until the forward branch into the fused runtime for covered steps
lands (the model-integration issue); keeping them here now fixes the resolution path.
"""

from sglang.srt.models import glm4_moe as _upstream


class GlmMoeDsaForCausalLM(_upstream.GlmMoeDsaForCausalLM):
    """GLM-5.3 target model."""


class GlmMoeDsaForCausalLMNextN(_upstream.GlmMoeDsaForCausalLMNextN):
    """GLM-5.3 MTP draft model."""


EntryClass = [GlmMoeDsaForCausalLM, GlmMoeDsaForCausalLMNextN]
