"""Blackwell (sm_100, NVFP4): declared so a backend drops in beside Hopper; no kernels yet."""
