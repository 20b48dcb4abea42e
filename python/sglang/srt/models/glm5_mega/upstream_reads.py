"""Every upstream SGLang name the fork's model package reads, in one place.

A CPU contract test imports each against the installed upstream (and checks the listed
signatures), and checks that the package's modules import nothing from upstream that is not
declared here. A rebase that breaks a read fails that test before anything runs.
"""

from sglang.srt.layers.fused_decode.spec import SERVER_ARG_FIELDS

# (module, attribute path)
UPSTREAM_READS = (
    ("sglang.srt.arg_groups.model_override_base", "resolving_view"),
    ("sglang.srt.arg_groups.model_override_base", "model_config_of"),
    ("sglang.srt.arg_groups.model_override_base", "resolved_view"),
    ("sglang.srt.arg_groups.overrides", "declare_resolution"),
    ("sglang.srt.runtime_context", "get_context"),
    ("sglang.srt.runtime_context", "get_exec"),
    ("sglang.srt.distributed.parallel_state", "get_tensor_model_parallel_rank"),
    ("sglang.srt.distributed.parallel_state", "get_tp_group"),
    ("sglang.srt.distributed", "tensor_model_parallel_all_reduce"),
    ("sglang.srt.model_executor.runner", "get_is_capture_mode"),
    ("sglang.srt.model_executor.forward_context", "get_token_to_kv_pool"),
    ("sglang.srt.model_executor.forward_context", "get_req_to_token_pool"),
    ("sglang.srt.model_executor.forward_context", "get_attn_backend"),
    ("sglang.srt.models.glm4_moe", "GlmMoeDsaForCausalLM"),
    ("sglang.srt.models.glm4_moe", "GlmMoeDsaForCausalLMNextN"),
    ("sglang.srt.models.glm5_next", "Glm5NextForConditionalGeneration"),
)

# Server-argument fields read through upstream's resolving / resolved views (spec's rules
# name the rest).
SERVER_ARGS_FIELDS = (
    "fused_decode_backend",  # added by patch 0001
    "enable_nvidia_megakernel",
    "enable_amd_monokernel",
    "cuda_graph_config",
    "disable_cuda_graph",
    "speculative_num_draft_tokens",
    "context_length",
    "max_running_requests",
) + SERVER_ARG_FIELDS

# Signatures the fork relies on: graph runners inspect forward's parameters, and the
# fork's forward overrides must keep them.
SIGNATURES = {
    ("sglang.srt.models.glm4_moe", "GlmMoeDsaForCausalLM.forward"): (
        "self", "input_ids", "positions", "forward_batch", "input_embeds", "pp_proxy_tensors",
    ),
    ("sglang.srt.models.glm4_moe", "GlmMoeDsaForCausalLMNextN.forward"): (
        "self", "input_ids", "positions", "forward_batch", "pp_proxy_tensors",
    ),
    ("sglang.srt.models.glm5_next", "Glm5NextForConditionalGeneration.forward"): (
        "self", "input_ids", "positions", "forward_batch", "input_embeds", "pp_proxy_tensors",
    ),
}

# Attributes read off upstream objects (not importable names, so not in UPSTREAM_READS);
# test/srt/unit/test_model_fused_cpu.py and test_model_draft_cpu.py read them from the target
# and draft models, pools and ForwardBatches that the installed upstream builds on CPU.
OBJECT_ATTRIBUTES = {
    "DeepseekV2ForCausalLM": ("model", "lm_head", "logits_processor",
                              "capture_aux_hidden_states"),
    "DeepseekV2Model": ("embed_tokens", "layers", "norm"),
    "DeepseekV3ForCausalLMNextN": ("model", "lm_head", "logits_processor"),
    "DeepseekModelNextN": ("embed_tokens", "enorm", "hnorm", "eh_proj", "decoder", "shared_head"),
    "RMSNorm": ("weight",),
    "nn.Linear (eh_proj)": ("weight", "bias"),
    "DeepseekV2DecoderLayer": ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm",
                               "layer_id"),
    "DeepseekV2AttentionMLA": ("fused_qkv_a_proj_with_mqa", "q_a_layernorm", "kv_a_layernorm",
                               "q_b_proj", "kv_b_proj", "o_proj", "indexer"),
    "Indexer": ("wq_b", "wk", "weights_proj", "wk_weights_proj", "k_norm"),
    "DeepseekV2MLP": ("gate_up_proj", "down_proj"),
    "DeepseekV2MoE": ("gate", "experts", "shared_experts", "num_fused_shared_experts"),
    "MoEGate": ("weight", "e_score_correction_bias"),
    "FusedMoE": ("w13_weight", "w13_weight_scale_inv", "w2_weight", "w2_weight_scale_inv"),
    "LinearBase (FP8 block)": ("weight", "weight_scale_inv"),
    "DSATokenToKVPool": ("get_key_buffer", "get_index_k_with_scale_buffer"),
    "ReqToTokenPool": ("req_to_token",),
    "ForwardBatch": ("forward_mode", "req_pool_indices", "num_token_non_padded",
                     "out_cache_loc", "spec_info", "reuse_dsa_topk_indices"),
    "EagleVerifyInput": ("dsa_seed_topk_capture",),
    "EagleDraftInput": ("hidden_states", "dsa_topk_indices"),
    # the draft's decode attention backend: in which index space it carries the top-k
    "DeepseekSparseAttnBackend": ("use_fused_topk",),
}
