"""AMD-specialised kernels, one subpackage per architecture."""
