"""MI355X (gfx950; FlyDSL + aiter): declared so a backend drops in beside Hopper; no kernels yet."""
