"""What the fused decode path serves, and the reasons it gives for refusing a setup.

Plain values in, reasons out: the caller (``sglang.srt.models.glm5_mega.hooks``) reads them
from upstream's resolved arguments. An unserved setup is refused before any weight loads,
with one error naming every reason; ``auto`` logs the reasons and runs upstream's path.
"""

from __future__ import annotations

from dataclasses import dataclass

OFF = "off"
AUTO = "auto"
# One value per kernel implementation (the subpackages of sgl_kernel_ext).
IMPLEMENTATIONS = ("triton", "nvidia_sm90", "nvidia_sm100", "amd_gfx950")
BACKEND_CHOICES = (OFF, AUTO) + IMPLEMENTATIONS

# An implementation is listed here once its plan builds every covered width of a served model.
BUILT_IMPLEMENTATIONS: frozenset[str] = frozenset()

# One tolerance set per kernel family, each naming the test that measured it. Errors are
# max |fused - reference| / max |reference| over the valid rows (see fused_decode.testing).
NUMERICS = {
    "fused_layer": {  # H200, one TP8 rank; measured max over 39 cases: 0.038, 0.0043, 0.0018
        "y_rel": 0.05,
        "residual_rel": 0.008,
        "kv_written_rel": 0.005,
        "topk_overlap": 0.99,
        "max_routing_flips": 1,  # rows whose own expert choice differs (near-ties)
        "measured_by": "test/srt/kernels/test_fused_layer.py::test_matches_reference",
    },
    "fused_layer_interpreter": {  # Triton's CPU interpreter truncates bf16 casts
        "y_rel": 0.12,
        "residual_rel": 0.03,
        "kv_written_rel": 0.05,
        "topk_overlap": 0.9,
        "max_routing_flips": 1,
        "measured_by": "test/srt/unit/test_kernels_interpreter.py::test_fused_layer_matches_reference",
    },
}

SERVED_ARCHITECTURES = (
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
)


@dataclass(frozen=True)
class Setup:
    """The facts of a server setup the fused path depends on, read at argument resolution."""

    architectures: tuple[str, ...]
    other_kernel_flags: tuple[str, ...] = ()  # upstream kernel-plugin flags also set


def refusal_reasons(backend: str, setup: Setup) -> list[str]:
    """Every reason the backend cannot serve this setup; empty when it can."""
    if backend not in BACKEND_CHOICES:
        return [f"unknown fused decode backend {backend!r}; choose one of {BACKEND_CHOICES}"]
    if backend == OFF:
        return []
    reasons = []
    if not any(arch in SERVED_ARCHITECTURES for arch in setup.architectures):
        reasons.append(
            f"architecture {list(setup.architectures)} is not served; the fused path serves "
            f"{list(SERVED_ARCHITECTURES)}"
        )
    if backend == AUTO and not BUILT_IMPLEMENTATIONS:
        reasons.append("no fused decode implementation has kernels in this build yet")
    elif backend != AUTO and backend not in BUILT_IMPLEMENTATIONS:
        reasons.append(f"implementation {backend!r} has no kernels in this build yet")
    for flag in setup.other_kernel_flags:
        reasons.append(f"{flag} is also set; both replace the model's decode step, use one")
    return reasons
