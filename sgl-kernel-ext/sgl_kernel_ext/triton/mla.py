"""MLA decode pieces for 1-16 rows, absorbed form, sparse over the indexer's top-k.

- ``latent``: RMSNorm of c_q and c_kv, interleaved rope of k_pe, and the KV-cache row
  [c_kv | k_pe] written at the row's slot (nothing for a pad row).
- ``absorb``: q_lat = q_nope . w_kc per head (bf16 out) and the roped q_pe, as one
  [rows, heads, kv_lora + rope] query.
- ``sparse_attention``: flash-decoding over the selected positions: each program takes one
  row and one chunk of its top-k for all of the rank's heads (the latent KV row is read once
  for every head), fp32 online softmax; ``combine`` merges the chunks (bf16 o_lat).
- ``absorb_v``: o = o_lat . w_vc per head (bf16), the o_proj input.

w_kc and w_vc are read in place from kv_b [heads * (nope + v), kv_lora] (no derived copy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_linear import interpreting


@triton.jit
def _rope_pairs(x1, x2, pos, inv_freq):
    f = pos.to(tl.float32) * inv_freq
    c = tl.cos(f)
    s = tl.sin(f)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _latent_kernel(qa_ptr, kva_ptr, stride_kva, qn_w_ptr, kvn_w_ptr, cq_ptr, kv_cache_ptr,
                   pos_ptr, slots_ptr, stride_slots, inv_freq_ptr, eps, Q, C, R,
                   BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, HALF_R: tl.constexpr):
    m = tl.program_id(0)
    oq = tl.arange(0, BLOCK_Q)
    q = tl.load(qa_ptr + m * Q + oq, mask=oq < Q, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) / Q + eps)
    wq = tl.load(qn_w_ptr + oq, mask=oq < Q, other=0.0).to(tl.float32)
    tl.store(cq_ptr + m * Q + oq, (q * wq).to(tl.bfloat16), mask=oq < Q)
    pos = tl.load(pos_ptr + m)
    if pos >= 0:
        slot = tl.load(slots_ptr + m * stride_slots + pos)
        oc = tl.arange(0, BLOCK_C)
        c = tl.load(kva_ptr + m * stride_kva + oc, mask=oc < C, other=0.0).to(tl.float32)
        c = c / tl.sqrt(tl.sum(c * c, axis=0) / C + eps)
        wc = tl.load(kvn_w_ptr + oc, mask=oc < C, other=0.0).to(tl.float32)
        row = kv_cache_ptr + slot * (C + R)
        tl.store(row + oc, (c * wc).to(tl.bfloat16), mask=oc < C)
        i = tl.arange(0, HALF_R)
        x1 = tl.load(kva_ptr + m * stride_kva + C + 2 * i).to(tl.float32)
        x2 = tl.load(kva_ptr + m * stride_kva + C + 2 * i + 1).to(tl.float32)
        r1, r2 = _rope_pairs(x1, x2, pos, tl.load(inv_freq_ptr + i))
        tl.store(row + C + 2 * i, r1.to(tl.bfloat16))
        tl.store(row + C + 2 * i + 1, r2.to(tl.bfloat16))


@triton.jit
def _absorb_kernel(q_ptr, kvb_ptr, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C,
                   NOPE: tl.constexpr, ROPE: tl.constexpr, V: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
                   INTERPRET: tl.constexpr):
    h = tl.program_id(0)
    ct = tl.program_id(1)
    om = tl.arange(0, BLOCK_M)
    od = tl.arange(0, BLOCK_D)
    oc = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = om < M
    qk = NOPE + ROPE
    q = tl.load(q_ptr + (om[:, None] * NH + h) * qk + od[None, :],
                mask=m_ok[:, None] & (od[None, :] < NOPE), other=0.0)
    w = tl.load(kvb_ptr + (h * (NOPE + V) + od[:, None]) * C + oc[None, :],
                mask=(od[:, None] < NOPE) & (oc[None, :] < C), other=0.0)
    if INTERPRET:
        lat = tl.dot(q.to(tl.float32), w.to(tl.float32))
    else:
        lat = tl.dot(q, w)
    out = qcat_ptr + (om[:, None] * NH + h) * (C + ROPE)
    tl.store(out + oc[None, :], lat.to(tl.bfloat16), mask=m_ok[:, None] & (oc[None, :] < C))
    if ct == 0:
        i = tl.arange(0, ROPE // 2)
        base = q_ptr + (om[:, None] * NH + h) * qk + NOPE
        x1 = tl.load(base + 2 * i[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
        x2 = tl.load(base + 2 * i[None, :] + 1, mask=m_ok[:, None], other=0.0).to(tl.float32)
        pos = tl.maximum(tl.load(pos_ptr + om, mask=m_ok, other=0), 0)
        r1, r2 = _rope_pairs(x1, x2, pos[:, None], tl.load(inv_freq_ptr + i)[None, :])
        tl.store(out + C + 2 * i[None, :], r1.to(tl.bfloat16), mask=m_ok[:, None])
        tl.store(out + C + 2 * i[None, :] + 1, r2.to(tl.bfloat16), mask=m_ok[:, None])


@triton.jit
def _sparse_attn_kernel(qcat_ptr, kv_cache_ptr, topk_ptr, stride_topk, slots_ptr, stride_slots,
                        part_o_ptr, part_ml_ptr, NH, sm_scale, chunk,
                        C: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_T: tl.constexpr, INTERPRET: tl.constexpr):
    m = tl.program_id(0)
    sp = tl.program_id(1)
    nsp = tl.num_programs(1)
    oh = tl.arange(0, BLOCK_H)
    oc = tl.arange(0, C)
    orr = tl.arange(0, R)
    h_ok = oh < NH
    qrow = qcat_ptr + (m * NH + oh[:, None]) * (C + R)
    q_lat = tl.load(qrow + oc[None, :], mask=h_ok[:, None], other=0.0)
    q_pe = tl.load(qrow + C + orr[None, :], mask=h_ok[:, None], other=0.0)
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, C), tl.float32)
    for t0 in range(sp * chunk, (sp + 1) * chunk, BLOCK_T):
        ot = t0 + tl.arange(0, BLOCK_T)
        p_ctx = tl.load(topk_ptr + m * stride_topk + ot)
        t_ok = p_ctx >= 0
        slot = tl.load(slots_ptr + m * stride_slots + tl.maximum(p_ctx, 0), mask=t_ok, other=0)
        rows = kv_cache_ptr + slot[:, None] * (C + R)
        kv = tl.load(rows + oc[None, :], mask=t_ok[:, None], other=0.0)
        kpe = tl.load(rows + C + orr[None, :], mask=t_ok[:, None], other=0.0)
        if INTERPRET:
            z = tl.dot(q_lat.to(tl.float32), tl.trans(kv.to(tl.float32)))
            z += tl.dot(q_pe.to(tl.float32), tl.trans(kpe.to(tl.float32)))
        else:
            z = tl.dot(q_lat, tl.trans(kv))
            z += tl.dot(q_pe, tl.trans(kpe))
        z = tl.where(t_ok[None, :], z * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(z - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if INTERPRET:
            acc = acc * alpha[:, None] + tl.dot(p, kv.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), kv)
        m_i = m_new
    base = (m * nsp + sp) * NH + oh
    tl.store(part_o_ptr + base[:, None] * C + oc[None, :], acc, mask=h_ok[:, None])
    tl.store(part_ml_ptr + base * 2, m_i, mask=h_ok)
    tl.store(part_ml_ptr + base * 2 + 1, l_i, mask=h_ok)


@triton.jit
def _combine_kernel(part_o_ptr, part_ml_ptr, olat_ptr, NH, NSP,
                    C: tl.constexpr, BLOCK_S: tl.constexpr):
    m = tl.program_id(0)
    h = tl.program_id(1)
    osp = tl.arange(0, BLOCK_S)
    oc = tl.arange(0, C)
    s_ok = osp < NSP
    base = (m * NSP + osp) * NH + h
    mi = tl.load(part_ml_ptr + base * 2, mask=s_ok, other=float("-inf"))
    li = tl.load(part_ml_ptr + base * 2 + 1, mask=s_ok, other=0.0)
    mx = tl.max(mi, axis=0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    scale = tl.where(s_ok, tl.exp(mi - mx), 0.0)
    o = tl.load(part_o_ptr + base[:, None] * C + oc[None, :], mask=s_ok[:, None], other=0.0)
    num = tl.sum(o * scale[:, None], axis=0)
    den = tl.sum(li * scale, axis=0)
    out = tl.where(den > 0, num / den, 0.0)
    tl.store(olat_ptr + (m * NH + h) * C + oc, out.to(tl.bfloat16))


@triton.jit
def _absorb_v_kernel(olat_ptr, kvb_ptr, o_ptr, M, NH, C: tl.constexpr, NOPE: tl.constexpr,
                     V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                     INTERPRET: tl.constexpr):
    h = tl.program_id(0)
    vt = tl.program_id(1)
    om = tl.arange(0, BLOCK_M)
    ov = vt * BLOCK_V + tl.arange(0, BLOCK_V)
    oc = tl.arange(0, C)
    m_ok = om < M
    a = tl.load(olat_ptr + (om[:, None] * NH + h) * C + oc[None, :], mask=m_ok[:, None], other=0.0)
    w = tl.load(kvb_ptr + (h * (NOPE + V) + NOPE + ov[:, None]) * C + oc[None, :])
    if INTERPRET:
        o = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)))
    else:
        o = tl.dot(a, tl.trans(w))
    tl.store(o_ptr + om[:, None] * (NH * V) + h * V + ov[None, :], o.to(tl.bfloat16),
             mask=m_ok[:, None])


def latent(qa, kva, q_a_norm, kv_a_norm, eps, positions, token_slots, inv_freq, cq, kv_cache,
           kv_lora: int, rope: int) -> None:
    m, q = qa.shape
    assert qa.is_contiguous() and kva.stride(1) == 1 and cq.is_contiguous()
    assert kv_cache.is_contiguous() and kv_cache.shape[1] == kv_lora + rope
    _latent_kernel[(m,)](qa, kva, kva.stride(0), q_a_norm, kv_a_norm, cq, kv_cache, positions,
                         token_slots, token_slots.stride(0), inv_freq, float(eps), q, kv_lora,
                         rope, BLOCK_Q=triton.next_power_of_2(q),
                         BLOCK_C=triton.next_power_of_2(kv_lora), HALF_R=rope // 2, num_warps=4)


def absorb(q, kv_b, positions, inv_freq, qcat, nope: int, rope: int, v: int,
           block_c: int = 64) -> None:
    """q bf16 [M, heads, nope + rope] -> qcat bf16 [M, heads, kv_lora + rope]."""
    m, nh, _ = q.shape
    c = kv_b.shape[1]
    assert q.is_contiguous() and kv_b.is_contiguous() and qcat.is_contiguous()
    _absorb_kernel[(nh, triton.cdiv(c, block_c))](
        q, kv_b, qcat, positions, inv_freq, m, nh, c, NOPE=nope, ROPE=rope, V=v,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_D=triton.next_power_of_2(nope),
        BLOCK_C=block_c, INTERPRET=interpreting(), num_warps=4)


def attention_block(topk: int) -> int:
    return min(32, triton.next_power_of_2(topk))


def attention_splits(rows: int, topk: int, target_programs: int = 128) -> int:
    """How many top-k chunks a row's attention is split into (a power of two)."""
    most = max(1, topk // attention_block(topk))
    want = max(1, target_programs // max(rows, 1))
    return min(most, triton.next_power_of_2(want))


def sparse_attention(qcat, kv_cache, topk, token_slots, sm_scale, part_o, part_ml, olat,
                     kv_lora: int, rope: int) -> None:
    """olat bf16 [M, heads, kv_lora] = softmax(scale * qcat . K) . c_kv over each row's top-k
    (context positions, -1 = none); part_o fp32 [M, S, heads, kv_lora], part_ml [M, S, heads, 2]."""
    m, nh, _ = qcat.shape
    splits = part_o.shape[1]
    k = topk.shape[1]
    block_t = attention_block(k)
    assert k % (splits * block_t) == 0 and topk.stride(1) == 1 and token_slots.stride(1) == 1
    _sparse_attn_kernel[(m, splits)](
        qcat, kv_cache, topk, topk.stride(0), token_slots, token_slots.stride(0), part_o,
        part_ml, nh, float(sm_scale), k // splits, C=kv_lora, R=rope,
        BLOCK_H=max(16, triton.next_power_of_2(nh)), BLOCK_T=block_t, INTERPRET=interpreting(),
        num_warps=4, num_stages=2)
    _combine_kernel[(m, nh)](part_o, part_ml, olat, nh, splits, C=kv_lora,
                             BLOCK_S=triton.next_power_of_2(splits), num_warps=4)


def absorb_v(olat, kv_b, o, nope: int, v: int, block_v: int = 64) -> None:
    """o bf16 [M, heads * v] = o_lat . w_vc per head."""
    m, nh, c = olat.shape
    assert olat.is_contiguous() and o.is_contiguous() and v % block_v == 0
    _absorb_v_kernel[(nh, v // block_v)](
        olat, kv_b, o, m, nh, C=c, NOPE=nope, V=v, BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_V=block_v, INTERPRET=interpreting(), num_warps=4)
