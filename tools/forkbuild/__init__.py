"""Builds and maintains the fork: upstream pin, patch series, overlay, wheel, rebase."""
