"""What the fused decode path serves, and the reasons it gives for refusing a setup.

Plain values in, reasons out: the caller (``sglang.srt.models.glm5_mega.hooks``) reads them
from upstream's resolved arguments and the checkpoint's config, before any weight loads. An
unserved setup is refused with one error naming every reason; ``auto`` logs the reasons and
runs upstream's path. ``Setup.server_args`` holds the resolved values of ``SERVER_ARG_FIELDS``;
a field left out is taken as served (tools and tests that only know the architecture).

Served (GLM-5.3 target, ``GlmMoeDsaForCausalLM``): CUDA, TP 1/2/4/8 (no PP, DP attention,
EP, context parallel), the FP8 block-128 checkpoint, bf16 KV with 64-token pages, the ``dsa``
attention backend, the ``auto`` / ``triton`` MoE runners, no speculation or EAGLE / NEXTN
with top-k 1 and at most 16 draft tokens, decode CUDA graphs ``full`` or disabled.

The MTP draft (``GlmMoeDsaForCausalLMNextN``) runs its draft-decode steps of 1..16 rows
(``draft_widths``; with ``index_share_for_mtp_iteration``, attending the top-k upstream carries
across them) on the same fused layer when ``draft_reasons`` gives none; otherwise the
draft alone is refused the fused path: each reason is logged at resolution and at the draft's
install, and the draft runs upstream's forward while the target keeps its fused steps (a setup
is served or refused by ``refusal_reasons``, which does not judge the draft).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

OFF = "off"
AUTO = "auto"
# One value per kernel implementation (the subpackages of sgl_kernel_ext).
IMPLEMENTATIONS = ("triton", "nvidia_sm90", "nvidia_sm100", "amd_gfx950")
BACKEND_CHOICES = (OFF, AUTO) + IMPLEMENTATIONS

# An implementation is listed here once its plan builds every covered width of a served model
# and its runtime has run end to end through upstream's own data structures.
BUILT_IMPLEMENTATIONS: frozenset[str] = frozenset()
# Implementations whose kernels are in this build and pass their GPU tests, but whose joined
# path has not yet run end to end through a server (test/srt/e2e). Named with UNVERIFIED_ENV=1
# they are served, with a warning, so that the end-to-end run that would list them in
# BUILT_IMPLEMENTATIONS can happen; without it they are refused, and auto never picks them.
UNVERIFIED_IMPLEMENTATIONS: frozenset[str] = frozenset({"triton"})
UNVERIFIED_ENV = "SGLANG_FUSED_DECODE_UNVERIFIED"

# One tolerance set per kernel family, each naming the test that measured it. Errors are
# max |fused - reference| / max |reference| over the valid rows (see fused_decode.testing).
NUMERICS = {
    # H200, one TP8 rank, 48 cases: measured max y 0.040, residual 0.0043, kv 0.0035, flips 0
    # (1 in earlier runs of the same cases)
    # (benchmark/results/fused_layer_numerics_h200_65b472b.json). The written KV rows are bf16,
    # so one rounding that differs from the reference's at their largest element is up to
    # 2^-7 of it: kv_written_rel allows that (0.008). With the transposed MMAs (fp8_linear.
    # swap) the 36 reference cases measured kv 0.0053, y 0.033, residual 0.0043; untransposed
    # 0.0035, 0.039, 0.0043; transposed with fp32 adds every 32 K elements 0.0067: a rounding
    # lottery, not accumulation precision (results/numerics_probe_*_20261201T1731*.json).
    # A form that rounds differently from SGLang by design is held to these bounds against a
    # reference that rounds as it does (attn_side's norm_in: reference.quant.FOLDED_INPUT_NORM,
    # its own distance from SGLang's rounding measured in test_reference_quant).
    "fused_layer": {
        "y_rel": 0.05,
        "residual_rel": 0.008,
        "kv_written_rel": 0.008,
        "topk_overlap": 0.99,
        "max_routing_flips": 1,  # rows whose own expert choice differs (near-ties)
        "measured_by": "test/srt/kernels/test_fused_layer.py::test_matches_reference",
    },
    "fused_layer_interpreter": {  # Triton's CPU interpreter truncates bf16 casts
        "y_rel": 0.12,
        # 0.032 measured on a first layer (no input residual) by
        # test/srt/unit/test_model_fused_cpu.py; 0.02 with an input residual
        "residual_rel": 0.035,
        "kv_written_rel": 0.05,
        "topk_overlap": 0.9,
        "max_routing_flips": 1,
        "measured_by": "test/srt/unit/test_kernels_interpreter.py::test_fused_layer_matches_reference",
    },
}

TARGET_ARCHITECTURE = "GlmMoeDsaForCausalLM"
DRAFT_ARCHITECTURE = "GlmMoeDsaForCausalLMNextN"
FLASH_ARCHITECTURE = "Glm5NextForConditionalGeneration"
SERVED_ARCHITECTURES = (TARGET_ARCHITECTURE, DRAFT_ARCHITECTURE)
# Resolve to the fork's classes, but no fused plan exists for them yet.
DECLARED_ARCHITECTURES = (FLASH_ARCHITECTURE,)

MAX_ROWS = 16  # the widest step the fused layers are built for
SERVED_TP_SIZES = (1, 2, 4, 8)
SERVED_KV_DTYPES = ("bfloat16", "bf16")  # the DSA pool's raw [slots, 1, 576] bf16 rows
SERVED_PAGE_SIZE = 64  # one index-K page = one KV page = 64 tokens
SERVED_ATTENTION_BACKENDS = ("dsa",)
SERVED_DSA_DECODE_BACKENDS = (None, "fa3", "flashmla_sparse", "flashmla_kv", "flashmla_auto",
                              "tilelang", "triton")
# Runners whose loaded FusedMoE weights keep the checkpoint's [E, 2I, H] / [E, H, I] block-FP8
# layout with [E, 2I/128, H/128] scales (the build checks the loaded shapes again).
SERVED_MOE_RUNNERS = ("auto", "triton")
SERVED_SPECULATIVE = (None, "EAGLE", "NEXTN")
SERVED_DECODE_GRAPH_BACKENDS = ("full", "disabled")
RAGGED_VERIFY_ENV = "SGLANG_RAGGED_VERIFY_MODE"
CHECK_ENV = "SGLANG_FUSED_DECODE_CHECK"  # check mode (fused_decode.check), eager only


def _off(value: Any) -> bool:
    return value in (None, False, 0, "", "null", "none", [], ())


# (server-arg field, served?, reason when not). Each row is one refusal reason.
_ARG_RULES: Tuple[Tuple[str, Callable[[Any], bool], str], ...] = (
    ("device", lambda v: v in (None, "cuda"), "device {v!r}: the fused kernels run on CUDA"),
    ("tp_size", lambda v: v in SERVED_TP_SIZES, f"--tp {{v}}: served TP sizes are {SERVED_TP_SIZES}"),
    ("pp_size", lambda v: v in (None, 1), "--pp {v}: pipeline parallelism is not served"),
    ("dp_size", lambda v: v in (None, 1), "--dp {v}: data parallelism is not served"),
    ("enable_dp_attention", _off, "--enable-dp-attention: DP attention relabels decode batches"),
    ("attn_dp_size", lambda v: v in (None, 1),
     "--attn-dp-size {v}: DP attention relabels decode batches"),
    ("ep_size", lambda v: v in (None, 1), "--ep {v}: expert parallelism is not served"),
    ("moe_a2a_backend", lambda v: v in (None, "none"), "--moe-a2a-backend {v}: A2A MoE is not served"),
    ("attn_cp_size", lambda v: v in (None, 1), "--attn-cp-size {v}: context parallelism is not served"),
    ("dcp_size", lambda v: v in (None, 1), "--dcp-size {v}: decode context parallelism is not served"),
    ("quantization", lambda v: v in (None, "fp8"),
     "--quantization {v}: the kernels read the checkpoint's FP8 block-128 weights"),
    ("kv_cache_dtype", lambda v: v in SERVED_KV_DTYPES,
     "--kv-cache-dtype {v}: served is bfloat16 (the FP8 DSA pool stores 656-byte scaled rows, "
     "not the fused layer's 576 bf16 values)"),
    ("page_size", lambda v: v == SERVED_PAGE_SIZE,
     f"--page-size {{v}}: the index-K and KV pages must be {SERVED_PAGE_SIZE} tokens"),
    ("attention_backend", lambda v: v in SERVED_ATTENTION_BACKENDS,
     "--attention-backend {v}: served is dsa (its MLA KV pool and FP8 index-K cache)"),
    ("decode_attention_backend", lambda v: v in (None,) + SERVED_ATTENTION_BACKENDS,
     "--decode-attention-backend {v}: served is dsa"),
    ("dsa_decode_backend", lambda v: v in SERVED_DSA_DECODE_BACKENDS,
     "--dsa-decode-backend {v}: its KV layout is not the raw bf16 one"),
    ("moe_runner_backend", lambda v: v in SERVED_MOE_RUNNERS,
     f"--moe-runner-backend {{v}}: served runners are {SERVED_MOE_RUNNERS}"),
    ("speculative_algorithm", lambda v: v in SERVED_SPECULATIVE,
     "--speculative-algorithm {v}: served is none, EAGLE or NEXTN (the GLM-5.3 MTP draft)"),
    ("speculative_eagle_topk", lambda v: v in (None, 1),
     "--speculative-eagle-topk {v}: tree verify is not served (top-k 1 only)"),
    ("speculative_num_draft_tokens", lambda v: v is None or 1 <= v <= MAX_ROWS,
     f"--speculative-num-draft-tokens {{v}}: a request's verify rows must fit {MAX_ROWS}"),
    ("speculative_adaptive", _off, "--speculative-adaptive: verify widths must be fixed"),
    ("speculative_use_block_verification", _off,
     "--speculative-use-block-verification is not served"),
    ("cuda_graph_backend_decode", lambda v: v in (None,) + SERVED_DECODE_GRAPH_BACKENDS,
     "decode CUDA graph backend {v}: served are full and disabled"),
    ("enable_lora", _off, "--enable-lora: LoRA adapters are not served"),
    ("lora_paths", _off, "--lora-paths: LoRA adapters are not served"),
    ("disaggregation_mode", _off, "--disaggregation-mode {v}: PD disaggregation is not served"),
    ("enable_hierarchical_cache", _off, "--enable-hierarchical-cache: HiCache is not served"),
    ("enable_hisparse", _off,
     "--enable-hisparse: HiSparse keeps part of the KV on the host; the fused layer reads the "
     "whole top-k from the device pool"),
    ("cpu_offload_gb", _off, "--cpu-offload-gb {v}: weight offload is not served"),
    ("offload_group_size", lambda v: v in (None, -1), "--offload-group-size {v}: offload is not served"),
    ("enable_torch_compile", _off, "--enable-torch-compile is not served"),
    ("enable_deterministic_inference", _off, "--enable-deterministic-inference is not served"),
    ("enable_return_routed_experts", _off, "--enable-return-routed-experts is not served"),
    ("enable_return_indexer_topk", _off, "--enable-return-indexer-topk is not served"),
    ("enable_return_aux_hidden_states", _off,
     "--enable-return-aux-hidden-states (EAGLE3 / DFlash capture) is not served"),
    ("enable_eplb", _off, "--enable-eplb is not served"),
    ("expert_distribution_recorder_mode", _off,
     "--expert-distribution-recorder-mode {v}: expert metrics are not served"),
    ("enable_two_batch_overlap", _off, "--enable-two-batch-overlap is not served"),
    ("enable_single_batch_overlap", _off, "--enable-single-batch-overlap is not served"),
    ("enable_pdmux", _off, "--enable-pdmux is not served"),
    ("dllm_algorithm", _off, "--dllm-algorithm {v}: diffusion decoding is not served"),
    ("speculative_enable_w4a4_mxfp4_megamoe", _off, "mega-MoE is not served"),
)

# The draft's own server arguments: (field, served?, reason when not), judged by draft_reasons.
_DRAFT_ARG_RULES: Tuple[Tuple[str, Callable[[Any], bool], str], ...] = (
    ("speculative_moe_runner_backend", lambda v: v in (None,) + SERVED_MOE_RUNNERS,
     f"--speculative-moe-runner-backend {{v}}: served draft runners are {SERVED_MOE_RUNNERS}"),
    ("speculative_moe_a2a_backend", lambda v: v in (None, "none"),
     "--speculative-moe-a2a-backend {v}: A2A MoE is not served"),
    ("speculative_draft_kv_cache_dtype", lambda v: v in (None, "auto") + SERVED_KV_DTYPES,
     "--speculative-draft-kv-cache-dtype {v}: the draft pool must hold raw bf16 rows"),
    ("speculative_draft_attention_backend", lambda v: v in (None,) + SERVED_ATTENTION_BACKENDS,
     "--speculative-draft-attention-backend {v}: served is dsa"),
    ("speculative_draft_model_quantization", lambda v: v in (None, "fp8"),
     "--speculative-draft-model-quantization {v}: the draft layer reads FP8 block-128 weights"),
    ("speculative_draft_window_size", lambda v: v is None,
     "--speculative-draft-window-size {v}: the fused draft layer attends its whole top-k"),
    ("enable_multi_layer_eagle", _off, "--enable-multi-layer-eagle: one MTP layer is served"),
)
SERVER_ARG_FIELDS = tuple(rule[0] for rule in _ARG_RULES + _DRAFT_ARG_RULES)


@dataclass(frozen=True)
class Setup:
    """The facts of a server setup the fused path depends on, read at argument resolution."""

    architectures: tuple[str, ...]
    other_kernel_flags: tuple[str, ...] = ()  # upstream kernel-plugin flags also set
    server_args: Mapping[str, Any] = field(default_factory=dict)  # SERVER_ARG_FIELDS values
    hf_config: Optional[Mapping[str, Any]] = None  # the checkpoint's config.json as a dict
    env: Mapping[str, str] = field(default_factory=dict)


def usable(backend: str, env: Mapping[str, str]) -> bool:
    """Whether the backend may build its plan: auto or a name listed as built, or a name with
    kernels not yet verified end to end when env opts in (UNVERIFIED_ENV=1)."""
    if backend == AUTO:
        return bool(BUILT_IMPLEMENTATIONS)
    return backend in BUILT_IMPLEMENTATIONS or (
        backend in UNVERIFIED_IMPLEMENTATIONS and env.get(UNVERIFIED_ENV, "0") == "1")


def unverified(backend: str) -> bool:
    """Whether a served backend is one not yet verified end to end (worth a warning)."""
    return backend != AUTO and backend not in BUILT_IMPLEMENTATIONS


def refusal_reasons(backend: str, setup: Setup) -> list[str]:
    """Every reason the backend cannot serve this setup; empty when it can."""
    if backend not in BACKEND_CHOICES:
        return [f"unknown fused decode backend {backend!r}; choose one of {BACKEND_CHOICES}"]
    if backend == OFF:
        return []
    reasons = []
    served = any(arch in SERVED_ARCHITECTURES for arch in setup.architectures)
    declared = [a for a in setup.architectures if a in DECLARED_ARCHITECTURES]
    if declared:
        reasons.append(f"architecture {declared} (GLM-5.3-Flash) has no fused decode plan in "
                       f"this build; served: {TARGET_ARCHITECTURE}")
    elif not served:
        reasons.append(
            f"architecture {list(setup.architectures)} is not served; the fused path serves "
            f"{list(SERVED_ARCHITECTURES)}"
        )
    if backend == AUTO and not BUILT_IMPLEMENTATIONS:
        reasons.append("no fused decode implementation has run end to end in this build yet")
    elif backend != AUTO and not usable(backend, setup.env):
        if backend in UNVERIFIED_IMPLEMENTATIONS:
            reasons.append(f"implementation {backend!r} has not run end to end through a server "
                           f"yet; {UNVERIFIED_ENV}=1 serves it anyway (for that run, "
                           "test/srt/e2e)")
        else:
            reasons.append(f"implementation {backend!r} has no kernels in this build yet")
    for flag in setup.other_kernel_flags:
        reasons.append(f"{flag} is also set; both replace the model's decode step, use one")
    if served:
        reasons += server_arg_reasons(setup.server_args, setup.env)
        if setup.hf_config is not None:
            reasons += config_reasons(setup.hf_config, setup.server_args.get("tp_size"))
    return reasons


def server_arg_reasons(args: Mapping[str, Any], env: Mapping[str, str] = {}) -> List[str]:
    reasons = []
    for name, ok, why in _ARG_RULES:
        if name in args and not ok(args[name]):
            reasons.append(why.format(v=args[name]))
    ragged = env.get(RAGGED_VERIFY_ENV, "static")
    if ragged != "static":
        reasons.append(f"{RAGGED_VERIFY_ENV}={ragged}: verify steps must have uniform widths")
    graphs = args.get("cuda_graph_backend_decode", "disabled")
    if env.get(CHECK_ENV, "0") not in ("", "0", "false", "False") and graphs != "disabled":
        reasons.append(f"{CHECK_ENV} is set: check mode is eager only, add --disable-cuda-graph "
                       "(a replayed graph cannot run the reference beside its layers)")
    return reasons


# (config key, upstream's default when absent, served values, what the kernels assume)
_CONFIG_RULES = (
    ("hidden_act", "silu", ("silu",), "SiLU experts"),
    ("scoring_func", None, ("sigmoid",), "sigmoid router scores"),
    ("topk_method", None, ("noaux_tc",), "noaux_tc routing with the fp32 correction bias"),
    ("n_group", 1, (1,), "one expert group"),
    ("topk_group", 1, (1,), "one expert group"),
    ("n_shared_experts", 1, (1,), "one shared expert"),
    ("moe_layer_freq", 1, (1,), "every layer past the dense ones is MoE"),
    ("index_head_dim", 128, (128,), "128-wide index keys"),
    ("rope_interleave", True, (True,), "interleaved MLA rope"),
    ("indexer_rope_interleave", False, (True,), "interleaved indexer rope"),
    ("index_kpool", 1, (1,), "no pooled index keys"),
    ("index_kpool_compress", False, (False,), "no pooled index keys"),
    ("index_k_norm_type", "layer", ("layer",), "LayerNorm index keys"),
    ("index_init_tokens", 0, (0,), "no forced initial tokens in the top-k"),
    ("index_local_tokens", 0, (0,), "no forced local tokens in the top-k"),
    ("cli_factor", 1, (1,), "no cross-layer index sharing factor"),
    ("num_hash_layers", 0, (0,), "no hash-routed layers"),
    ("llama_4_scaling", None, (None,), "no llama-4 attention scaling"),
    ("mla_nope", False, (False,), "MLA with rope"),
    ("swiglu_limit", None, (None,), "no SwiGLU clamp"),
    ("router_fp32", False, (False,), "a bf16 router GEMM with fp32 output"),
    ("tie_word_embeddings", False, (False,), "an untied LM head"),
)


def config_reasons(hf: Mapping[str, Any], tp_size: Optional[int] = None) -> List[str]:
    """Reasons the checkpoint's config breaks an assumption of the kernels (GLM-5.3 only)."""
    reasons = []
    for key, default, served, meaning in _CONFIG_RULES:
        value = hf.get(key, default)
        if value not in served:
            reasons.append(f"config {key}={value!r}: the kernels assume {meaning} "
                           f"({key}={served[0]!r})")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", "default") not in ("default", None):
        reasons.append(f"config rope_type={rope.get('rope_type')!r}: the kernels assume "
                       "plain rope (no YaRN mscale)")
    qc = hf.get("quantization_config") or {}
    if (qc.get("quant_method") != "fp8" or qc.get("activation_scheme") != "dynamic"
            or list(qc.get("weight_block_size") or ()) != [128, 128]):
        reasons.append("checkpoint quantization: served is FP8 block-128 with dynamic "
                       f"activation scales; got {dict(qc) or None}")
    if reasons:
        return reasons
    try:  # the rest of the reference's own checks (shapes, block alignment, TP split)
        from .reference.config import Glm5Config

        cfg = Glm5Config.from_dict(dict(hf))
        if tp_size:
            cfg.check_tp(int(tp_size))
    except ValueError as e:
        reasons.append(f"config: {e}")
    return reasons


def draft_reasons(setup: Setup) -> List[str]:
    """Every reason the MTP draft's decode steps cannot run fused (empty: they can, or the
    setup has no draft). The draft then runs upstream's forward; the setup stays served."""
    args = setup.server_args
    algo = args.get("speculative_algorithm")
    if getattr(algo, "name", algo) not in ("EAGLE", "NEXTN"):
        return []
    reasons = [why.format(v=args[name]) for name, ok, why in _DRAFT_ARG_RULES
               if name in args and not ok(args[name])]
    # index_share_for_mtp_iteration (GLM-5.3's config) is served: the fused draft attends the
    # top-k upstream carries across its iterations (fused_decode.carry); upstream carries one
    # only at EAGLE top-k 1 and, for a DSA seed, index_kpool 1 (config_reasons), without PD
    # disaggregation (refused), so its seed is slots or positions of the request.
    return reasons


def draft_widths() -> Dict[str, Tuple[int, ...]]:
    """Row counts the fused MTP draft covers: its draft-decode steps (one row per request at
    EAGLE top-k 1) of 1..MAX_ROWS rows; draft-extend and every other mode run upstream's."""
    return {"decode": tuple(range(1, MAX_ROWS + 1))}


def verify_widths(draft_tokens: Optional[int]) -> Tuple[int, ...]:
    """Covered target-verify row counts: whole requests of `draft_tokens` rows, up to MAX_ROWS."""
    if not draft_tokens:
        return ()
    return tuple(range(draft_tokens, MAX_ROWS + 1, draft_tokens))


def covered_widths(speculative: Optional[str], draft_tokens: Optional[int]) -> Dict[str, Tuple[int, ...]]:
    """Row counts per forward mode that run the fused path on the target model: every decode
    step of 1..MAX_ROWS rows, and with EAGLE / NEXTN the target-verify steps of whole
    requests (a verify step of any other width runs upstream's forward)."""
    spec_on = speculative not in (None, "", "none")
    return {"decode": tuple(range(1, MAX_ROWS + 1)),
            "target_verify": verify_widths(draft_tokens) if spec_on else ()}
