"""Hopper (sm_90) kernels in CuTe DSL, where measurement shows the portable kernel falls short."""
