"""The region table of a layer's ahead-of-time L2 prefetch (overlap.region_table): every byte
of each contiguous weight covered once, in requests of at most the chunk, 16-byte multiples."""

import torch

from sgl_kernel_ext.triton import overlap


def test_region_table_covers_each_weight_once_in_chunks():
    a = torch.empty(1000, dtype=torch.uint8)  # 1000 = 62 * 16 + 8: the ragged 8 bytes left out
    b = torch.empty(64, 48, dtype=torch.bfloat16)  # 6144 bytes
    strided = torch.empty(8, 8)[:, ::2]  # not contiguous: left out
    table = overlap.region_table([a, None, b, strided], "cpu", chunk=256)
    assert table.dtype == torch.int64 and table.shape[1] == 2
    sizes = table[:, 1]
    assert bool((sizes % 16 == 0).all()) and int(sizes.max()) <= 256
    for t, covered in ((a, 992), (b, 6144)):
        base = t.data_ptr()
        mine = table[(table[:, 0] >= base) & (table[:, 0] < base + covered)]
        assert int(mine[:, 1].sum()) == covered
        starts = mine[:, 0] - base
        assert starts.tolist() == list(range(0, covered, 256))
    assert len(table) == 4 + 24


def test_empty_region_table_is_one_zero_request():
    table = overlap.region_table([None], "cpu")
    assert table.tolist() == [[0, 0]]
