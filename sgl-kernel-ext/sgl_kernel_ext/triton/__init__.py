"""Portable Triton kernels of the fused decode path; free of vendor-only intrinsics."""
