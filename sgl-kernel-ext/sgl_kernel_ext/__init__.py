"""Vendor kernels of the fused decode path (``sgl_kernel_ext``).

``triton/`` holds portable kernels (NVIDIA and AMD, and the Triton CPU interpreter in
tests); ``nvidia/sm90/`` Hopper-specialised kernels; ``nvidia/sm100/`` and
``amd/gfx950/`` are declared for Blackwell and MI355X and hold nothing yet. The package
imports no SGLang module.
"""

__version__ = "0.1.0"

# Implementations a fused decode backend can name, and whether this build has kernels for it.
IMPLEMENTATIONS = {
    "triton": "sgl_kernel_ext.triton",
    "nvidia_sm90": "sgl_kernel_ext.nvidia.sm90",
    "nvidia_sm100": "sgl_kernel_ext.nvidia.sm100",
    "amd_gfx950": "sgl_kernel_ext.amd.gfx950",
}
