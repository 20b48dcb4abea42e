"""NVIDIA-specialised kernels, one subpackage per architecture."""
