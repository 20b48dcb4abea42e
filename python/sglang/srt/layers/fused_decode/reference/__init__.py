"""Torch reference of one GLM-5.3 decode step: the ground truth for the fused kernels.

Imports only torch, safetensors and the standard library (no upstream SGLang module), so it runs
on a GPU machine that has only torch and triton. Numerics follow SGLang 0.5.23's CUDA path
(`quant.Numerics`); see each module's docstring:

config      GLM-5.3 config from config.json (real and tiny)
rng         counter-based random values (slice- and device-independent)
weights     one TP rank's random FP8 block-128 weights, built on the target device
quant       FP8 e4m3 block-128 weight / per-128-group activation numerics
ops         RMSNorm, LayerNorm, interleaved rope, SiLU-and-mul
batch       rows of a step (positions, slot tables, pad rows)
cache       latent KV cache and FP8 index cache, read and written at slots
indexer     DSA indexer: index-key write, scores, SGLang top-k
attention   MLA latent projections, absorbed sparse attention, o_proj partial
moe         dense MLP, router, shared + routed experts
model       layer_forward, decode_step, prefill (TP ranks simulated, pluggable all-reduce)
mtp         the MTP draft step: eh_proj input, the draft layer, head norm, LM head
checkpoint  Hugging Face FP8 checkpoint writer / reader / validator
engine      prefill + greedy decode over the reference
kl          KL of decode against prefill of the same prefix

Entry points: `config.glm53_config()` / `tiny_config()` / `Glm5Config.from_dict(d)`;
`weights.generate_weights(cfg, seed, tp_size, tp_rank, device, layers)`;
`cache.alloc_caches(cfg, num_slots, device)`; `batch.decode_batch(positions, tables)`;
`model.layer_forward(cfg, shards, hidden, residual, batch, caches, topk_prev, num, reduce)`,
`model.decode_step(cfg, weights, input_ids, batch, caches)`, `model.prefill(...)`;
`checkpoint.write_checkpoint(cfg, path, seed)` / `read_checkpoint(path)`;
`engine.ReferenceEngine`; `kl.decode_vs_prefill_kl(cfg, weights, prompts, steps)`.
"""
