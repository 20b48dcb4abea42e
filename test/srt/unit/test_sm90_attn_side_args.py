"""sm90 attn_side's host side, on CPU: its derived sizes for one GLM-5.3 TP8 rank (K splits,
units, the ring within shared memory, q_b's prologue lanes), and each wrong argument refused
with a message naming it before anything is compiled or launched."""

import pytest
import torch

pytest.importorskip("cutlass.cute", reason="CuTe DSL (nvidia-cutlass-dsl) is not installed")

from sgl_kernel_ext.nvidia.sm90 import attn_side as A  # noqa: E402

SMALL = A.Shape(nq=512, nkv=192, k1=1024, nb=512)
M = 3


def test_tp8_rank_sizes():
    for m, nx, lanes in ((1, 8, 32), (4, 8, 32), (8, 8, 16), (9, 16, 8), (16, 16, 8)):
        side = A.AttnSide(m)
        assert (side.split1, side.split2, side.chunk1, side.chunk2) == (6, 8, 8, 2)
        assert (side.units1, side.units) == (41 * 6, 41 * 6 + 32 * 8)
        assert side.nx == nx and side.lanes == lanes and side.lanes * side.cols == 128
        # each worker's ring holds a q_a|kv_a unit's slots and q_b's B tiles fit beside it
        assert side.per >= side.chunk1 and side.stages * side.slot_bytes < A.SMEM_BYTES


def _args(**over):
    e4m3 = torch.float8_e4m3fn
    side = A.AttnSide(M, SMALL)
    nq, nkv, k1, nb = SMALL
    work = A.Work(torch.zeros(side.split1, M, nq), torch.zeros(2 * side.tq, M),
                  torch.zeros(side.tq, dtype=torch.int32),
                  torch.zeros(A.FLAGS + side.tq, dtype=torch.int32))
    a = dict(xq=torch.zeros(8, k1, dtype=e4m3), sx=torch.zeros(M, k1 // 128),
             wq=torch.zeros(nq, k1, dtype=e4m3), wsq=torch.zeros(nq // 128, k1 // 128),
             wkv=torch.zeros(nkv, k1, dtype=e4m3), wskv=torch.zeros(2, k1 // 128),
             gamma=torch.zeros(nq, dtype=torch.bfloat16), wb=torch.zeros(nb, nq, dtype=e4m3),
             wsb=torch.zeros(nb // 128, nq // 128),
             kv_parts=torch.zeros(side.split1, M, nkv),
             q_rows=torch.zeros(M, nq, dtype=torch.bfloat16),
             qb_parts=torch.zeros(side.split2, M, nb), work=work)
    a.update(over)
    return a


WRONG = {
    "1..16 rows": dict(q_rows=torch.zeros(17, 512, dtype=torch.bfloat16)),
    "NQ must be a multiple of 256": dict(q_rows=torch.zeros(M, 384, dtype=torch.bfloat16)),
    "split1 must divide 8": dict(kv_parts=torch.zeros(3, M, 192)),
    "xq needs at least 8 rows": dict(xq=torch.zeros(4, 1024, dtype=torch.float8_e4m3fn)),
    "gamma must be a contiguous torch.bfloat16": dict(gamma=torch.zeros(512)),
    "q_rows must be": dict(q_rows=torch.zeros(M, 512)),
    "wsb must be": dict(wsb=torch.zeros(4, 3)),
    "sx must be": dict(sx=torch.zeros(M + 1, 8)),
}


@pytest.mark.parametrize("message", list(WRONG))
def test_refuses(message):
    with pytest.raises(ValueError, match=message):
        A.attn_side(**_args(**WRONG[message]))


def test_refuses_another_steps_work():
    other = A.Work(torch.zeros(4, M, 512), torch.zeros(16, M), torch.zeros(8, dtype=torch.int32),
                   torch.zeros(A.FLAGS + 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="q_parts must be"):
        A.attn_side(**_args(work=other))


def test_fixed_form_sizes_and_refusals():
    side = A.AttnSide(2, fixed=True)
    assert (side.lanes, side.cols) == (128, 1) and side.fixed
    assert A.workspace(side, "cpu").acc.shape == (2, 2, 2048 + 576)
    assert A.workspace(side, "cpu").arrivals.shape == (2 * 41,) and side.kv_tasks == 2
    with pytest.raises(ValueError, match="fixed form takes 1..2 rows"):
        A.AttnSide(3, fixed=True)
    # a workspace of the tail form has no sums and one count a tile
    a = _args(q_rows=torch.zeros(2, 512, dtype=torch.bfloat16), sx=torch.zeros(2, 8),
              kv_parts=torch.zeros(8, 2, 192), qb_parts=torch.zeros(4, 2, 512))
    side2 = A.AttnSide(2, SMALL)
    a["work"] = A.workspace(side2, "cpu")
    with pytest.raises(ValueError, match="arrivals must be"):
        A.attn_side(**a, fixed=True)
    fixed = A.AttnSide(2, SMALL, fixed=True)
    a["work"] = a["work"]._replace(arrivals=torch.zeros(2 * fixed.tiles1, dtype=torch.int32))
    with pytest.raises(ValueError, match="acc must be"):
        A.attn_side(**a, fixed=True)
    # the fixed form writes the KV-cache rows: their inputs are required and checked
    a["work"] = A.workspace(fixed, "cpu")
    with pytest.raises(ValueError, match="pass \\['kv_norm', 'positions'"):
        A.attn_side(**a, fixed=True, token_slots=torch.zeros(2, 8, dtype=torch.int32),
                    inv_freq=torch.zeros(32), kv_cache=torch.zeros(16, 192, dtype=torch.bfloat16))
    kv = dict(kv_norm=torch.zeros(128, dtype=torch.bfloat16),
              positions=torch.zeros(2, dtype=torch.int64),
              token_slots=torch.zeros(2, 8, dtype=torch.int32), inv_freq=torch.zeros(32),
              kv_cache=torch.zeros(16, 192, dtype=torch.bfloat16))
    for name, bad, message in (
            ("kv_norm", torch.zeros(192, dtype=torch.bfloat16), "kv_norm must be"),
            ("positions", torch.zeros(2, dtype=torch.int32), "positions must be"),
            ("token_slots", torch.zeros(2, 8, dtype=torch.int16),
             "token_slots must be int32 or int64"),
            ("token_slots", torch.zeros(3, 8, dtype=torch.int32), "token_slots must be"),
            ("kv_cache", torch.zeros(16, 576, dtype=torch.bfloat16), "kv_cache must be")):
        with pytest.raises(ValueError, match=message):
            A.attn_side(**a, fixed=True, **{**kv, name: bad})
    # a pool's table read in place: any number of table rows, slot_rows int64 [M]
    pool = dict(kv, token_slots=torch.zeros(5, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="slot_rows must be"):
        A.attn_side(**a, fixed=True, **pool, slot_rows=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="token_slots must be"):
        A.attn_side(**a, fixed=True, **pool)  # 5 table rows for 2 step rows, no slot_rows


def test_fixed_form_stands_in_for_kv_parts_and_only_it_takes_slot_rows():
    fixed = A.AttnSide(2, SMALL, fixed=True)
    work = A.workspace(fixed, "cpu")
    assert work.kv_stub.shape == (fixed.split1, 2, 192)
    assert A.workspace(A.AttnSide(2, SMALL), "cpu").kv_stub is None
    a = _args(q_rows=torch.zeros(2, 512, dtype=torch.bfloat16), sx=torch.zeros(2, 8),
              kv_parts=None, qb_parts=torch.zeros(4, 2, 512))
    a["work"] = A.workspace(A.AttnSide(2, SMALL), "cpu")
    with pytest.raises(ValueError, match="kv_parts may be None only in the fixed form"):
        A.attn_side(**a)
    a["kv_parts"] = torch.zeros(8, 2, 192)
    with pytest.raises(ValueError, match="slot_rows is the fixed form's"):
        A.attn_side(**a, slot_rows=torch.zeros(2, dtype=torch.int64))


def test_norm_in_sizes_and_refusals():
    """The input norm folded in (norm_in): the fixed form's only; its B buffer holds a
    q_a|kv_a unit's 8 groups beside the same ring; hidden, residual, the weight and the new
    residual checked by name, the new residual refused where it overlaps the residual read."""
    side = A.AttnSide(2, fixed=True, norm_in=True)
    assert (side.xg, A.AttnSide(2, fixed=True).xg) == (side.chunk1, side.chunk2) == (8, 2)
    xbuf = side.groups * side.xg * side.nx * A.BLOCK_K
    assert side.per >= side.chunk1 and side.stages * side.slot_bytes + xbuf < A.SMEM_BYTES
    with pytest.raises(ValueError, match="fixed form's"):
        A.AttnSide(2, norm_in=True)
    fixed = A.AttnSide(2, SMALL, fixed=True)
    a = _args(q_rows=torch.zeros(2, 512, dtype=torch.bfloat16), sx=torch.zeros(2, 8),
              kv_parts=None, qb_parts=torch.zeros(4, 2, 512), work=A.workspace(fixed, "cpu"))
    assert a["work"].ss_in.shape == (fixed.split1 * 2,)
    kv = dict(kv_norm=torch.zeros(128, dtype=torch.bfloat16),
              positions=torch.zeros(2, dtype=torch.int64),
              token_slots=torch.zeros(2, 8, dtype=torch.int32), inv_freq=torch.zeros(32),
              kv_cache=torch.zeros(16, 192, dtype=torch.bfloat16))
    bf = dict(dtype=torch.bfloat16)
    hidden, residual, out = (torch.zeros(2, 1024, **bf) for _ in range(3))
    weight = torch.zeros(1024, **bf)
    both = torch.zeros(3, 1024, **bf)
    for fold, message in (
            ((hidden.float(), residual, weight, out), "hidden must be"),
            ((hidden, residual[:1], weight, out), "residual must be"),
            ((hidden, residual, weight[:512], out), "norm weight must be"),
            ((hidden, residual, weight, out.t()), "residual_out must be"),
            ((hidden, residual, weight, residual), "overlaps the residual"),
            ((hidden, both[:2], weight, both[1:]), "overlaps the residual")):
        with pytest.raises(ValueError, match=message):
            A.attn_side(**a, fixed=True, **kv, norm_in=fold)
    a["work"] = a["work"]._replace(ss_in=None)
    with pytest.raises(ValueError, match="workspace of the fixed form"):
        A.attn_side(**a, fixed=True, **kv, norm_in=(hidden, residual, weight, out))
