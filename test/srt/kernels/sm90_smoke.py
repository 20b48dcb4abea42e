"""One fp8_mma launch per process (a fault in one kernel ends its CUDA context, and with it
every later test's): `python3 test/srt/kernels/sm90_smoke.py M N K [pdl]` prints the worst
error against a float64 reference, or the error."""

import sys

import torch

from sgl_kernel_ext.nvidia.sm90.fp8_mma import fp8_mma, split_for, x_rows

m, n, k = map(int, sys.argv[1:4])
pdl = len(sys.argv) > 4 and sys.argv[4] == "pdl"
g = torch.Generator(device="cuda").manual_seed(0)
wq = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
ws = torch.rand(-(-n // 128), k // 128, device="cuda", generator=g) + 0.1
xq = torch.zeros(x_rows(m), k, device="cuda").to(torch.float8_e4m3fn)
xq[:m] = torch.randn(m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
sx = torch.rand(m, k // 128, device="cuda", generator=g) + 0.1
split = split_for(n, k)
parts = torch.full((split, m, n), float("nan"), device="cuda")
fp8_mma(xq, sx, wq, ws, parts, pdl=pdl)
torch.cuda.synchronize()
x = xq[:m].double() * sx.double().repeat_interleave(128, 1)
w = wq.double() * ws.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
ref = x @ w.T
scale = x.abs() @ w.abs().T
diff = (parts.double().sum(0) - ref).abs()
print(f"smoke m={m} n={n} k={k} split={split} pdl={pdl}: max err / max |y| "
      f"{diff.max().item() / ref.abs().max().item():.2e}, max err / sum |x w| "
      f"{(diff / scale).max().item():.2e}, unwritten {int(parts.isnan().sum())}")
