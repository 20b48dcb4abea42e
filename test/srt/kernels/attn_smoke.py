"""Smoke run of mla.sparse_attention at GLM-5.3's widths on the GPU, alone, for
compute-sanitizer: rows x 2048 entries over a random cache, in a chosen form, against the
direct softmax.

    compute-sanitizer --tool memcheck python3 test/srt/kernels/attn_smoke.py 16 swap 4
"""

from __future__ import annotations

import sys

import torch

from sgl_kernel_ext.triton import mla


def main(rows: int, form: str, warps: int) -> None:
    c, r, nh, k = 512, 64, 8, 2048
    g = torch.Generator(device="cuda").manual_seed(rows)
    kv = torch.randn(rows * k + 7, c + r, device="cuda", generator=g).bfloat16()
    slots = torch.randperm(rows * k + 7, device="cuda", generator=g)[:rows * k].view(rows, k)
    topk = torch.stack([torch.randperm(k, device="cuda", generator=g) for _ in range(rows)])
    topk = topk.int()
    topk[0, 100:300] = -1
    qcat = torch.randn(rows, nh, c + r, device="cuda", generator=g).bfloat16()
    if form == "swap":
        mla.ATTN_SWAP_FROM_STEPS, mla.ATTN_SWAP_WARPS = 1, warps
    splits = mla.attention_splits(rows, k)
    part_o = torch.full((rows, splits, nh, c), float("nan"), device="cuda")
    part_ml = torch.full((rows, splits, nh, 2), float("nan"), device="cuda")
    olat = torch.full((rows, nh, c), float("nan"), device="cuda", dtype=torch.bfloat16)
    mla.sparse_attention(qcat, kv, topk, slots, 0.07, part_o, part_ml, olat, c, r)
    torch.cuda.synchronize()
    worst = 0.0
    for m in range(rows):
        sel = topk[m][topk[m] >= 0].long()
        keys = kv[slots[m, sel]].float()
        want = torch.softmax(qcat[m].float() @ keys.T * 0.07, -1) @ keys[:, :c]
        worst = max(worst, (olat[m].float() - want).abs().max().item())
    print(f"attention rows={rows} form={form} warps={warps} splits={splits}: "
          f"max |err| {worst:.3e}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
