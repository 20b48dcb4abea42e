"""tiling_probe's verdict (CPU): each variant against the baselines beside it in run order."""

from benchmark import tiling_probe as tp


def _rows(kind, m, seq):
    return [{"kind": kind, "M": m, "variant": v, "us": us} for v, us in seq]


def test_each_variant_is_measured_against_its_neighbouring_baselines():
    rows = (_rows("moe", 1, [("baseline", 10.0), ("a", 9.0), ("baseline", 12.0), ("b", 15.0),
                             ("baseline", 11.0), ("a", 13.0)])
            + _rows("dense", 16, [("baseline", 20.0), ("b", 19.5)]))
    d = tp.deltas(rows)
    assert d[("moe", 1)]["a"] == [9.0 - 11.0, 13.0 - 11.0]  # the last one: a baseline before only
    assert d[("moe", 1)]["b"] == [15.0 - 11.5]
    assert d[("moe", 1)]["noise"] == [2.0]
    assert d[("dense", 16)] == {"b": [-0.5]}  # one baseline: no spread to report
    table = tp.table(rows).splitlines()
    assert table[0] == "| kind | M | noise | a | b |"
    assert table[2] == "| dense | 16 | n/a |  | -0.5 |"
    assert table[3] == "| moe | 1 | 2.0 | +0.0 | +3.5 |"
