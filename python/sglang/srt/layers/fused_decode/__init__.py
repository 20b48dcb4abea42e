"""Fused small-step decode runtime for GLM-5.3 and GLM-5.3-Flash.

Imports no upstream SGLang module, so it runs on a GPU machine that has only torch and
triton (``PYTHONPATH=python:sgl-kernel-ext``). Upstream is joined only in
``sglang.srt.models.glm5_mega``.
"""
