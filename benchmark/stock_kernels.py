"""Plain per-operation Triton kernels the stock arm launches (one launch per operation).

Each kernel is the ordinary single-purpose kernel a serving stack launches for one operation of
a GLM-5.3 decode layer at small M: per-128-group FP8 activation quant, block-FP8 W8A8 GEMM
(split-K with a reduce launch when the N grid alone is too small), fused add + RMSNorm, the
latent norms + rope + KV-cache write, the indexer's q/k rope + quant (+ index-cache write),
indexer logits over the paged FP8 index cache, sparse MLA decode (split over the selected
tokens, then a combine launch), the router's sigmoid + biased top-k, and a grouped MoE GEMM in
the checkpoint's per-expert layout (the shared expert handled as one more expert, as SGLang fuses it). Weights are read as stored (FP8 stays
FP8). Written for this project; no third-party code.

Under TRITON_INTERPRET=1 (CPU checks) bf16 dot operands are widened to fp32 (the interpreter's
bf16 dot is wrong); on the GPU they stay bf16.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

DOT_F32 = os.environ.get("TRITON_INTERPRET") == "1"
FP8_MAX = 448.0
NUM_SMS = 132


# ------------------------------------------------------------------ activation quant
@triton.jit
def _act_quant(x_ptr, q_ptr, s_ptr, K, G: tl.constexpr):
    row, g = tl.program_id(0), tl.program_id(1)
    offs = g * G + tl.arange(0, G)
    x = tl.load(x_ptr + row * K + offs).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), 0), 1e-10) / 448.0
    q = tl.clamp(x / s, -448.0, 448.0)
    tl.store(q_ptr + row * K + offs, q.to(tl.float8e4nv))
    tl.store(s_ptr + row * (K // G) + g, s)


def act_quant(x: torch.Tensor, group: int = 128):
    """Per-row, per-128-columns e4m3 quant of a contiguous [R, K] tensor: (q, s [R, K/128])."""
    x = x.contiguous()
    r, k = x.shape
    q = torch.empty(r, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(r, k // group, dtype=torch.float32, device=x.device)
    _act_quant[(r, k // group)](x, q, s, k, group)
    return q, s


# ------------------------------------------------------------------ block-FP8 GEMM
@triton.jit
def _fp8_gemm(a_ptr, as_ptr, w_ptr, ws_ptr, c_ptr, M, N, K, K_PER_SPLIT,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn, pk = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    kb_n = tl.cdiv(K, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    k0 = pk * K_PER_SPLIT
    for kk in range(k0, tl.minimum(k0 + K_PER_SPLIT, K), BK):
        a = tl.load(a_ptr + rm[:, None] * K + kk + rk[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + kk + rk[None, :], mask=rn[:, None] < N, other=0.0)
        a_s = tl.load(as_ptr + rm * kb_n + kk // BK, mask=rm < M, other=0.0)
        w_s = tl.load(ws_ptr + (rn // 128) * kb_n + kk // BK, mask=rn < N, other=0.0)
        acc += tl.dot(a, tl.trans(w)) * a_s[:, None] * w_s[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptr + pk * M * N + rm[:, None] * N + rn[None, :], acc, mask=mask)


@triton.jit
def _split_reduce(p_ptr, c_ptr, MN, SPLIT: tl.constexpr, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    mask = offs < MN
    acc = tl.zeros((B,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def gemm_plan(m: int, n: int, k: int):
    """(BN, SPLIT): 64-wide N tiles; split K until about two programs per SM."""
    bn = 64
    tiles = triton.cdiv(n, bn)
    kb = k // 128
    split = 1
    while tiles * split * 2 <= 2 * NUM_SMS and kb % (split * 2) == 0 and kb // (split * 2) >= 4:
        split *= 2
    return bn, split


def fp8_gemm(aq, a_s, w_q, w_s, out_dtype=torch.bfloat16):
    """y [M, N] = (aq * a_s) (w_q * w_s)^T, block-128 scales, fp32 accumulation, one rounding."""
    m, k = aq.shape
    n = w_q.shape[0]
    assert m <= 16 and k % 128 == 0
    bn, split = gemm_plan(m, n, k)
    kps = k // split
    c = torch.empty(m, n, dtype=out_dtype, device=aq.device)
    if split == 1:
        _fp8_gemm[(triton.cdiv(n, bn), 1)](aq, a_s, w_q, w_s, c, m, n, k, kps, 16, bn, 128, 1)
        return c
    part = torch.empty(split, m, n, dtype=torch.float32, device=aq.device)
    _fp8_gemm[(triton.cdiv(n, bn), split)](aq, a_s, w_q, w_s, part, m, n, k, kps, 16, bn, 128, split)
    _split_reduce[(triton.cdiv(m * n, 1024),)](part, c, m * n, split, 1024)
    return c


# ------------------------------------------------------------------ norms, rope, latent
@triton.jit
def _add_rms_norm(x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr, N, eps, HAS_RES: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(r_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(res_out_ptr + row * N + offs, x.to(res_out_ptr.dtype.element_ty), mask=mask)
    inv = tl.rsqrt(tl.sum(x * x, 0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + offs, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x, residual, weight, eps):
    """(norm(x + residual) bf16, x + residual bf16); residual None: (norm(x), x)."""
    m, n = x.shape
    out = torch.empty_like(x)
    res = torch.empty_like(x)
    _add_rms_norm[(m,)](x, residual if residual is not None else x, weight, out, res, n, eps,
                        residual is not None, triton.next_power_of_2(n))
    return out, res


@triton.jit
def _rope_pair(x_ev, x_od, pos, theta, ROT: tl.constexpr):
    """Interleaved rope of pairs (x_ev[i], x_od[i]), i < ROT/2 (fp32)."""
    i = tl.arange(0, ROT // 2).to(tl.float32)
    inv = tl.exp2(-(2.0 * i / ROT) * tl.log2(theta))
    f = pos.to(tl.float32) * inv
    c, s = tl.cos(f), tl.sin(f)
    return x_ev * c - x_od * s, x_od * c + x_ev * s


@triton.jit
def _latent_post(qkv_ptr, qn_w, kvn_w, cq_ptr, kv_cache_ptr, slots_ptr, pos_ptr, eps, theta,
                 QL: tl.constexpr, KVL: tl.constexpr, ROPE: tl.constexpr):
    """Row m of [c_q | c_kv | k_pe]: RMSNorm c_q -> cq; RMSNorm c_kv, rope k_pe -> cache slot."""
    m = tl.program_id(0)
    W: tl.constexpr = QL + KVL + ROPE
    oq = tl.arange(0, QL)
    cq = tl.load(qkv_ptr + m * W + oq).to(tl.float32)
    cq = cq * tl.rsqrt(tl.sum(cq * cq, 0) / QL + eps) * tl.load(qn_w + oq).to(tl.float32)
    tl.store(cq_ptr + m * QL + oq, cq.to(cq_ptr.dtype.element_ty))
    slot = tl.load(slots_ptr + m)
    pos = tl.load(pos_ptr + m)
    if slot >= 0:
        ok = tl.arange(0, KVL)
        ckv = tl.load(qkv_ptr + m * W + QL + ok).to(tl.float32)
        ckv = ckv * tl.rsqrt(tl.sum(ckv * ckv, 0) / KVL + eps) * tl.load(kvn_w + ok).to(tl.float32)
        base = kv_cache_ptr + slot * (KVL + ROPE)
        tl.store(base + ok, ckv.to(kv_cache_ptr.dtype.element_ty))
        half = tl.arange(0, ROPE // 2)
        ev = tl.load(qkv_ptr + m * W + QL + KVL + 2 * half).to(tl.float32)
        od = tl.load(qkv_ptr + m * W + QL + KVL + 2 * half + 1).to(tl.float32)
        e2, o2 = _rope_pair(ev, od, pos, theta, ROPE)
        tl.store(base + KVL + 2 * half, e2.to(kv_cache_ptr.dtype.element_ty))
        tl.store(base + KVL + 2 * half + 1, o2.to(kv_cache_ptr.dtype.element_ty))


def latent_post(qkv, q_norm, kv_norm, kv_cache, out_slots, positions, eps, theta, ql, kvl, rope):
    m = qkv.shape[0]
    cq = torch.empty(m, ql, dtype=qkv.dtype, device=qkv.device)
    _latent_post[(m,)](qkv, q_norm, kv_norm, cq, kv_cache, out_slots, positions, eps, theta,
                       ql, kvl, rope)
    return cq


@triton.jit
def _rope_q(q_ptr, qpe_ptr, pos_ptr, theta, HEADS: tl.constexpr, QK: tl.constexpr,
            NOPE: tl.constexpr, ROPE: tl.constexpr):
    """q_pe [M, heads, ROPE] bf16 = rope(q[m, h, NOPE:])."""
    m, h = tl.program_id(0), tl.program_id(1)
    half = tl.arange(0, ROPE // 2)
    base = q_ptr + (m * HEADS + h) * QK + NOPE
    ev = tl.load(base + 2 * half).to(tl.float32)
    od = tl.load(base + 2 * half + 1).to(tl.float32)
    e2, o2 = _rope_pair(ev, od, tl.load(pos_ptr + m), theta, ROPE)
    out = qpe_ptr + (m * HEADS + h) * ROPE
    tl.store(out + 2 * half, e2.to(qpe_ptr.dtype.element_ty))
    tl.store(out + 2 * half + 1, o2.to(qpe_ptr.dtype.element_ty))


def rope_q(q, positions, theta, heads, nope, rope):
    m = q.shape[0]
    qpe = torch.empty(m, heads, rope, dtype=q.dtype, device=q.device)
    _rope_q[(m, heads)](q, qpe, positions, theta, heads, nope + rope, nope, rope)
    return qpe


# ------------------------------------------------------------------ indexer
@triton.jit
def _index_q(q_ptr, q8_ptr, qs_ptr, pos_ptr, theta, HEADS: tl.constexpr, D: tl.constexpr,
             ROPE: tl.constexpr):
    """Per (row, head): rope dims 0..ROPE-1 (interleaved), e4m3 with one scale max(amax,1e-4)/448."""
    m, h = tl.program_id(0), tl.program_id(1)
    base = q_ptr + (m * HEADS + h) * D
    half = tl.arange(0, ROPE // 2)
    ev = tl.load(base + 2 * half).to(tl.float32)
    od = tl.load(base + 2 * half + 1).to(tl.float32)
    e2, o2 = _rope_pair(ev, od, tl.load(pos_ptr + m), theta, ROPE)
    rest = tl.arange(0, D - ROPE)
    tail = tl.load(base + ROPE + rest).to(tl.float32)
    amax = tl.maximum(tl.maximum(tl.max(tl.abs(e2), 0), tl.max(tl.abs(o2), 0)), tl.max(tl.abs(tail), 0))
    s = tl.maximum(amax, 1e-4) / 448.0
    out = q8_ptr + (m * HEADS + h) * D
    tl.store(out + 2 * half, tl.clamp(e2 / s, -448.0, 448.0).to(tl.float8e4nv))
    tl.store(out + 2 * half + 1, tl.clamp(o2 / s, -448.0, 448.0).to(tl.float8e4nv))
    tl.store(out + ROPE + rest, tl.clamp(tail / s, -448.0, 448.0).to(tl.float8e4nv))
    tl.store(qs_ptr + m * HEADS + h, s)


@triton.jit
def _index_k(kw_ptr, nw_ptr, nb_ptr, qs_ptr, hw_ptr, cache_ptr, cache_f32_ptr, slots_ptr, pos_ptr,
             eps, theta, w_scale, HEADS: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
             PAGE: tl.constexpr):
    """Row m of [k | w_raw]: LayerNorm + rope + e4m3 key into the index cache; head weights."""
    m = tl.program_id(0)
    W: tl.constexpr = D + HEADS
    i = tl.arange(0, D // 2)
    ke = tl.load(kw_ptr + m * W + 2 * i).to(tl.float32)
    ko = tl.load(kw_ptr + m * W + 2 * i + 1).to(tl.float32)
    mean = (tl.sum(ke, 0) + tl.sum(ko, 0)) / D
    ke -= mean
    ko -= mean
    inv = tl.rsqrt((tl.sum(ke * ke, 0) + tl.sum(ko * ko, 0)) / D + eps)
    ke = ke * inv * tl.load(nw_ptr + 2 * i).to(tl.float32) + tl.load(nb_ptr + 2 * i).to(tl.float32)
    ko = ko * inv * tl.load(nw_ptr + 2 * i + 1).to(tl.float32) + tl.load(nb_ptr + 2 * i + 1).to(tl.float32)
    oh = tl.arange(0, HEADS)
    w_raw = tl.load(kw_ptr + m * W + D + oh).to(tl.float32)
    tl.store(hw_ptr + m * HEADS + oh, w_raw * w_scale * tl.load(qs_ptr + m * HEADS + oh))
    slot = tl.load(slots_ptr + m)
    if slot >= 0:
        inv_f = tl.exp2(-(2.0 * i.to(tl.float32) / ROPE) * tl.log2(theta))
        f = tl.load(pos_ptr + m).to(tl.float32) * inv_f
        c, s = tl.cos(f), tl.sin(f)
        rot = i < ROPE // 2
        ke2 = tl.where(rot, ke * c - ko * s, ke)
        ko2 = tl.where(rot, ko * c + ke * s, ko)
        sc = tl.maximum(tl.maximum(tl.max(tl.abs(ke2), 0), tl.max(tl.abs(ko2), 0)), 1e-4) / 448.0
        page = slot // PAGE
        off = slot % PAGE
        kb = cache_ptr + page * (PAGE * (D + 4)) + off * D
        tl.store(kb + 2 * i, tl.clamp(ke2 / sc, -448.0, 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True))
        tl.store(kb + 2 * i + 1, tl.clamp(ko2 / sc, -448.0, 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True))
        tl.store(cache_f32_ptr + page * (PAGE * (D + 4) // 4) + PAGE * D // 4 + off, sc)


@triton.jit
def _index_logits(q8_ptr, hw_ptr, cache_ptr, cache_f32_ptr, slots_ptr, lens_ptr, out_ptr, L_MAX,
                  SLOT_STRIDE,
                  HEADS: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                  BL: tl.constexpr):
    """scores[m, p] = sum_h w[m,h] relu(q8[m,h] . k8[p]) * scale_k[p] over p < seq_len, else -inf."""
    m, pb = tl.program_id(0), tl.program_id(1)
    p = pb * BL + tl.arange(0, BL)
    n = tl.load(lens_ptr + m)
    ok = p < n
    oh = tl.arange(0, HP)
    od = tl.arange(0, D)
    q = tl.load(q8_ptr + (m * HEADS + oh[:, None]) * D + od[None, :], mask=oh[:, None] < HEADS,
                other=0.0)
    hw = tl.load(hw_ptr + m * HEADS + oh, mask=oh < HEADS, other=0.0)
    slot = tl.load(slots_ptr + m * SLOT_STRIDE + p, mask=ok, other=0)
    page = slot // PAGE
    off = slot % PAGE
    kb = cache_ptr + page * (PAGE * (D + 4)) + off * D
    k = tl.load(kb[:, None] + od[None, :], mask=ok[:, None], other=0)
    k = k.to(tl.float8e4nv, bitcast=True)
    ks = tl.load(cache_f32_ptr + page * (PAGE * (D + 4) // 4) + PAGE * D // 4 + off, mask=ok,
                 other=0.0)
    dots = tl.dot(q, tl.trans(k))  # [HP, BL] fp32
    sc = tl.sum(tl.maximum(dots, 0.0) * hw[:, None], 0) * ks
    sc = tl.where(ok, sc, float("-inf"))
    tl.store(out_ptr + m * L_MAX + p, sc, mask=p < L_MAX)


def index_q(q, positions, theta, heads, dim, rope):
    """(q8 e4m3 [M, heads, dim], scales fp32 [M, heads]) of the roped indexer query."""
    m = q.shape[0]
    q8 = torch.empty(m, heads, dim, dtype=torch.float8_e4m3fn, device=q.device)
    qs = torch.empty(m, heads, dtype=torch.float32, device=q.device)
    _index_q[(m, heads)](q, q8, qs, positions, theta, heads, dim, rope)
    return q8, qs


def index_k(kw, norm_w, norm_b, q_scale, index_cache, out_slots, positions, eps, theta, heads,
            dim, rope, page=64):
    """Write this step's index keys; return the head weights fp32 [M, heads]."""
    m = kw.shape[0]
    hw = torch.empty(m, heads, dtype=torch.float32, device=kw.device)
    _index_k[(m,)](kw, norm_w, norm_b, q_scale, hw, index_cache, index_cache.view(torch.float32),
                   out_slots, positions, eps, theta, (heads * dim) ** -0.5, heads, dim, rope, page)
    return hw


def index_logits(q8, head_w, index_cache, token_slots, seq_lens, width, page=64, bl=64):
    """fp32 scores [M, width] over each row's context (-inf past it)."""
    m, heads, dim = q8.shape
    out = torch.empty(m, width, dtype=torch.float32, device=q8.device)
    hp = max(16, triton.next_power_of_2(heads))
    _index_logits[(m, triton.cdiv(width, bl))](
        q8, head_w, index_cache, index_cache.view(torch.float32), token_slots, seq_lens, out,
        width, token_slots.stride(0), heads, hp, dim, page, bl)
    return out


# ------------------------------------------------------------------ sparse MLA decode
@triton.jit
def _mla_split(qlat_ptr, qpe_ptr, cache_ptr, topk_ptr, slots_ptr, o_ptr, ml_ptr, TOPK, SLOT_STRIDE,
               scale, HEADS: tl.constexpr, HP: tl.constexpr, KVL: tl.constexpr,
               ROPE: tl.constexpr, BT: tl.constexpr, PER_SPLIT: tl.constexpr,
               DOT_F32: tl.constexpr):
    """Attention of row m's heads over selected positions [sp*PER_SPLIT, +PER_SPLIT): partial
    o (unnormalized, fp32), running max and sum, for the combine launch."""
    m, sp = tl.program_id(0), tl.program_id(1)
    nsp = tl.num_programs(1)
    oh = tl.arange(0, HP)
    oc = tl.arange(0, KVL)
    orp = tl.arange(0, ROPE)
    hm = oh < HEADS
    ql = tl.load(qlat_ptr + (m * HEADS + oh[:, None]) * KVL + oc[None, :], mask=hm[:, None], other=0.0)
    qp = tl.load(qpe_ptr + (m * HEADS + oh[:, None]) * ROPE + orp[None, :], mask=hm[:, None], other=0.0)
    if DOT_F32:
        ql = ql.to(tl.float32)
        qp = qp.to(tl.float32)
    mx = tl.full((HP,), float("-inf"), tl.float32)
    sm = tl.zeros((HP,), tl.float32)
    acc = tl.zeros((HP, KVL), tl.float32)
    W: tl.constexpr = KVL + ROPE
    for t0 in range(sp * PER_SPLIT, (sp + 1) * PER_SPLIT, BT):
        t = t0 + tl.arange(0, BT)
        pos = tl.load(topk_ptr + m * TOPK + t, mask=t < TOPK, other=-1)
        ok = pos >= 0
        slot = tl.load(slots_ptr + m * SLOT_STRIDE + pos, mask=ok, other=0)
        kl = tl.load(cache_ptr + slot[:, None] * W + oc[None, :], mask=ok[:, None], other=0.0)
        kp = tl.load(cache_ptr + slot[:, None] * W + KVL + orp[None, :], mask=ok[:, None], other=0.0)
        if DOT_F32:
            kl = kl.to(tl.float32)
            kp = kp.to(tl.float32)
        z = (tl.dot(ql, tl.trans(kl)) + tl.dot(qp, tl.trans(kp))) * scale
        z = tl.where(ok[None, :], z, float("-inf"))
        new = tl.maximum(mx, tl.max(z, 1))
        safe = tl.where(new == float("-inf"), 0.0, new)
        alpha = tl.exp(mx - safe)
        p = tl.exp(z - safe[:, None])
        sm = sm * alpha + tl.sum(p, 1)
        if DOT_F32:
            acc = acc * alpha[:, None] + tl.dot(p, kl)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(kl.dtype), kl)
        mx = new
    base = (m * nsp + sp) * HP
    tl.store(o_ptr + (base + oh[:, None]) * KVL + oc[None, :], acc)
    tl.store(ml_ptr + (base + oh) * 2, mx)
    tl.store(ml_ptr + (base + oh) * 2 + 1, sm)


@triton.jit
def _mla_combine(o_ptr, ml_ptr, out_ptr, NSP: tl.constexpr, HEADS: tl.constexpr,
                 HP: tl.constexpr, KVL: tl.constexpr):
    m, h = tl.program_id(0), tl.program_id(1)
    oc = tl.arange(0, KVL)
    osp = tl.arange(0, NSP)
    base = (m * NSP + osp) * HP + h
    mx = tl.load(ml_ptr + base * 2)
    sm = tl.load(ml_ptr + base * 2 + 1)
    g = tl.max(mx, 0)
    g = tl.where(g == float("-inf"), 0.0, g)
    wgt = tl.exp(mx - g)
    tot = tl.sum(sm * wgt, 0)
    o = tl.load(o_ptr + base[:, None] * KVL + oc[None, :])
    o = tl.sum(o * wgt[:, None], 0) / tl.where(tot > 0, tot, 1.0)
    tl.store(out_ptr + (m * HEADS + h) * KVL + oc, o.to(out_ptr.dtype.element_ty))


def sparse_mla(q_lat, q_pe, kv_cache, topk, token_slots, scale, splits=16, bt=32):
    """o_lat [M, heads, KVL] bf16 of attention over the context positions in topk (-1 unused)."""
    q_lat, q_pe = q_lat.contiguous(), q_pe.contiguous()
    m, heads, kvl = q_lat.shape
    rope = q_pe.shape[-1]
    hp = max(16, triton.next_power_of_2(heads))
    ntop = topk.shape[1]
    per = triton.cdiv(triton.cdiv(ntop, splits), bt) * bt
    o = torch.empty(m * splits * hp, kvl, dtype=torch.float32, device=q_lat.device)
    ml = torch.empty(m * splits * hp, 2, dtype=torch.float32, device=q_lat.device)
    _mla_split[(m, splits)](q_lat, q_pe, kv_cache, topk, token_slots, o, ml, ntop,
                            token_slots.stride(0), scale, heads, hp, kvl, rope, bt, per, DOT_F32,
                            num_warps=4)
    out = torch.empty(m, heads, kvl, dtype=q_lat.dtype, device=q_lat.device)
    _mla_combine[(m, heads)](o, ml, out, splits, heads, hp, kvl)
    return out


# ------------------------------------------------------------------ router and MoE
@triton.jit
def _route(logit_ptr, bias_ptr, ids_ptr, w_ptr, table_ptr, E, TOPK: tl.constexpr,
           EP: tl.constexpr, scaling, RENORM: tl.constexpr):
    """Row m: sigmoid scores, top-k of score + bias (ties to the lower id), renormalized weights
    x scaling; table[m, e] = slot of expert e in the row (shared expert E: slot TOPK), else -1."""
    m = tl.program_id(0)
    oe = tl.arange(0, EP)
    em = oe < E
    s = tl.sigmoid(tl.load(logit_ptr + m * E + oe, mask=em, other=0.0))
    c = tl.where(em, s + tl.load(bias_ptr + oe, mask=em, other=0.0), float("-inf"))
    slot = tl.full((EP,), -1, tl.int32)
    total = 0.0
    for j in tl.static_range(TOPK):
        best = tl.max(c, 0)
        idx = tl.min(tl.where(c == best, oe, EP), 0)
        total += tl.sum(tl.where(oe == idx, s, 0.0), 0)
        slot = tl.where(oe == idx, j, slot)
        c = tl.where(oe == idx, float("-inf"), c)
    if RENORM:
        norm = scaling / (total + 1e-20)
    else:
        norm = scaling
    chosen = slot >= 0
    tl.store(ids_ptr + m * (TOPK + 1) + tl.where(chosen, slot, 0), oe, mask=chosen)
    tl.store(ids_ptr + m * (TOPK + 1) + TOPK, E)
    tl.store(w_ptr + m * (TOPK + 1) + tl.where(chosen, slot, 0), s * norm, mask=chosen)
    tl.store(w_ptr + m * (TOPK + 1) + TOPK, 1.0)
    slot = tl.where(oe == E, TOPK, slot)
    tl.store(table_ptr + m * (E + 1) + oe, slot, mask=oe < E + 1)


def route(logits, bias, top_k, scaling, renorm=True):
    """(ids int32 [M, k+1], weights fp32 [M, k+1], table int32 [M, E+1]); the last column of
    ids / weights is the shared expert (id E, weight 1.0)."""
    m, e = logits.shape
    ids = torch.empty(m, top_k + 1, dtype=torch.int32, device=logits.device)
    w = torch.empty(m, top_k + 1, dtype=torch.float32, device=logits.device)
    table = torch.empty(m, e + 1, dtype=torch.int32, device=logits.device)
    _route[(m,)](logits, bias, ids, w, table, e, top_k, triton.next_power_of_2(e + 1), scaling,
                 renorm)
    return ids, w, table


@triton.jit
def _up_tile(xq_ptr, xs_ptr, g_ptr, gs_ptr, u_ptr, us_ptr, rm, ok, rn, H, BN: tl.constexpr,
             BK: tl.constexpr):
    rk = tl.arange(0, BK)
    kb_n = H // BK
    g = tl.zeros((16, BN), tl.float32)
    u = tl.zeros((16, BN), tl.float32)
    for kk in range(0, H, BK):
        a = tl.load(xq_ptr + rm[:, None] * H + kk + rk[None, :], mask=ok[:, None], other=0.0)
        a_s = tl.load(xs_ptr + rm * kb_n + kk // BK, mask=ok, other=0.0)
        wg = tl.load(g_ptr + rn[:, None] * H + kk + rk[None, :])
        wu = tl.load(u_ptr + rn[:, None] * H + kk + rk[None, :])
        sg = tl.load(gs_ptr + (rn // 128) * kb_n + kk // BK)
        su = tl.load(us_ptr + (rn // 128) * kb_n + kk // BK)
        g += tl.dot(a, tl.trans(wg)) * a_s[:, None] * sg[None, :]
        u += tl.dot(a, tl.trans(wu)) * a_s[:, None] * su[None, :]
    return g, u


@triton.jit
def _moe_up(xq_ptr, xs_ptr, gq, gs, uq, us, sgq, sgs, suq, sus, table_ptr, h_ptr, M, E, H, INTER,
            SLOTS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Expert e (program 0; e == E is the shared expert), N tile of the intermediate
    (program 1): h[m, slot] = bf16(SiLU(g) * u) for the rows that chose e."""
    e, pn = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, 16)
    slot = tl.load(table_ptr + rm * (E + 1) + e, mask=rm < M, other=-1)
    if tl.max(slot, 0) < 0:
        return
    ok = slot >= 0
    rn = pn * BN + tl.arange(0, BN)
    if e == E:
        g, u = _up_tile(xq_ptr, xs_ptr, sgq, sgs, suq, sus, rm, ok, rn, H, BN, BK)
    else:
        wq = e.to(tl.int64) * INTER * H
        ws = e.to(tl.int64) * (INTER // 128) * (H // BK)
        g, u = _up_tile(xq_ptr, xs_ptr, gq + wq, gs + ws, uq + wq, us + ws, rm, ok, rn, H, BN, BK)
    g = g.to(tl.bfloat16).to(tl.float32)
    u = u.to(tl.bfloat16).to(tl.float32)
    h = (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + ((rm * SLOTS + slot)[:, None]) * INTER + rn[None, :], h, mask=ok[:, None])


@triton.jit
def _down_tile(hq_ptr, hs_ptr, w_ptr, ws_ptr, pr, ok, rn, INTER, BN: tl.constexpr,
               BK: tl.constexpr):
    rk = tl.arange(0, BK)
    kb_n = INTER // BK
    acc = tl.zeros((16, BN), tl.float32)
    for kk in range(0, INTER, BK):
        a = tl.load(hq_ptr + pr[:, None] * INTER + kk + rk[None, :], mask=ok[:, None], other=0.0)
        a_s = tl.load(hs_ptr + pr * kb_n + kk // BK, mask=ok, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * INTER + kk + rk[None, :])
        w_s = tl.load(ws_ptr + (rn // 128) * kb_n + kk // BK)
        acc += tl.dot(a, tl.trans(w)) * a_s[:, None] * w_s[None, :]
    return acc


@triton.jit
def _moe_down(hq_ptr, hs_ptr, dq, ds, sdq, sds, table_ptr, wt_ptr, y_ptr, M, E, H, INTER,
              SLOTS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Expert e, N tile of the hidden size: y[m, slot] = bf16(weight * (h W_down^T))."""
    e, pn = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, 16)
    slot = tl.load(table_ptr + rm * (E + 1) + e, mask=rm < M, other=-1)
    if tl.max(slot, 0) < 0:
        return
    ok = slot >= 0
    pr = rm * SLOTS + tl.where(ok, slot, 0)
    rn = pn * BN + tl.arange(0, BN)
    if e == E:
        acc = _down_tile(hq_ptr, hs_ptr, sdq, sds, pr, ok, rn, INTER, BN, BK)
    else:
        wq = e.to(tl.int64) * H * INTER
        ws = e.to(tl.int64) * (H // 128) * (INTER // BK)
        acc = _down_tile(hq_ptr, hs_ptr, dq + wq, ds + ws, pr, ok, rn, INTER, BN, BK)
    wt = tl.load(wt_ptr + pr, mask=ok, other=0.0)
    y = (acc * wt[:, None]).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + pr[:, None] * H + rn[None, :], y, mask=ok[:, None])


def moe(xq, xs, gate, up, down, sh_gate, sh_up, sh_down, table, weights, bn_up=32, bn_down=64):
    """Shared + routed experts of M rows: bf16 [M, H]. gate/up/down: contiguous stacks
    (q [E, N, K], s) as the checkpoint holds them; sh_*: the shared expert's matrices."""
    m, h = xq.shape
    e, inter, _ = gate.q.shape
    slots = weights.shape[1]
    assert m <= 16 and gate.q.is_contiguous() and up.q.is_contiguous() and down.q.is_contiguous()
    hbuf = torch.empty(m * slots, inter, dtype=torch.bfloat16, device=xq.device)
    _moe_up[(e + 1, inter // bn_up)](xq, xs, gate.q, gate.s, up.q, up.s, sh_gate.q, sh_gate.s,
                                     sh_up.q, sh_up.s, table, hbuf, m, e, h, inter, slots,
                                     bn_up, 128)
    hq, hs = act_quant(hbuf)
    y = torch.empty(m * slots, h, dtype=torch.bfloat16, device=xq.device)
    _moe_down[(e + 1, triton.cdiv(h, bn_down))](hq, hs, down.q, down.s, sh_down.q, sh_down.s,
                                                table, weights, y, m, e, h, inter, slots,
                                                bn_down, 128)
    return y.view(m, slots, h).sum(1, dtype=torch.float32).to(torch.bfloat16)


@triton.jit
def _silu_mul_quant(x_ptr, q_ptr, s_ptr, INTER, G: tl.constexpr):
    """[g | u] row -> e4m3 of bf16(SiLU(g) * u) per 128 columns (the dense MLP's middle)."""
    row, grp = tl.program_id(0), tl.program_id(1)
    offs = grp * G + tl.arange(0, G)
    g = tl.load(x_ptr + row * 2 * INTER + offs).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * INTER + INTER + offs).to(tl.float32)
    a = (g * tl.sigmoid(g) * u).to(tl.bfloat16).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(a), 0), 1e-10) / 448.0
    tl.store(q_ptr + row * INTER + offs, tl.clamp(a / s, -448.0, 448.0).to(tl.float8e4nv))
    tl.store(s_ptr + row * (INTER // G) + grp, s)


def silu_mul_quant(gu):
    m, two_i = gu.shape
    inter = two_i // 2
    q = torch.empty(m, inter, dtype=torch.float8_e4m3fn, device=gu.device)
    s = torch.empty(m, inter // 128, dtype=torch.float32, device=gu.device)
    _silu_mul_quant[(m, inter // 128)](gu, q, s, inter, 128)
    return q, s
