"""Layer and step benchmarks of the GLM-5.3 decode path on one H200, against the HBM floor.

roofline      bytes per layer kind and per step, floor = bytes / measured bandwidth
stock         the stock arm: the reference layer as SGLang launches it (one kernel per op)
stock_kernels plain per-operation Triton kernels the stock arm launches
upstream      loads upstream SGLang's Triton kernels from its wheel at run time (arm b)
harness       weights, caches, rows, CUDA-graph timing, bandwidth, JSON, table, plot
decode_layer  one layer of each kind, M x L sweep
decode_step   the whole one-rank step (or --layers N)
plot          PNG of fraction-of-floor against M from a results JSON
"""
