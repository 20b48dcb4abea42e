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
checkpoint  Hugging Face FP8 checkpoint writer / reader / validator
engine      prefill + greedy decode over the reference
kl          KL of decode against prefill of the same prefix
"""
