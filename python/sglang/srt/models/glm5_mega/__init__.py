"""The fork's GLM-5.3 and GLM-5.3-Flash model classes: the one place that joins upstream
SGLang and the fused decode runtime (``sglang.srt.layers.fused_decode``).

Upstream's model registry loads every module here over its own classes (patch 0002), so
the architectures resolve to the classes of ``glm5`` and ``glm5_flash``. ``hooks`` holds
upstream's calls into the fork; ``upstream_reads`` declares every upstream name read here.
"""
