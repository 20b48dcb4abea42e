"""tiling_probe's verdict (CPU): each variant against the baselines beside it in run order;
the inputs and floor it shares with decode_layer."""

import re
from pathlib import Path

import pytest

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


RELEASE_RUN = Path(tp.__file__).parent / "release_run.sh"


def test_every_pending_variant_of_release_run_exists():
    """release_run.sh pending's, pending_long's, vo's, nf's and norm_in's variants are
    tiling_probe's (a typo would cost a device call)."""
    script = RELEASE_RUN.read_text()
    for var in ("PENDING", "PENDING_LONG", "VO", "NF", "NORM_IN"):
        # VAR="a,b" or VAR="${VAR:-a,b}" (a default the environment may replace)
        names = [n for line in re.findall(rf'^{var}="(?:\${{{var}:-)?([^"}}]*)}}?"$', script,
                                          re.M)
                 for n in line.replace(f"${var}", "").split(",") if n]
        assert len(names) >= 2 and all(n in tp.VARIANTS for n in names), (var, names)


def test_every_resweep_variant_of_release_run_exists():
    """release_run.sh resweep's list (several lines, baselines among them) names tiling_probe's
    variants only (a typo would cost a device call), each once, a baseline every ~10."""
    (body,) = re.findall(r'^RESWEEP="([^"]*)"$', RELEASE_RUN.read_text(), re.M)
    names = body.split()
    unknown = [n for n in names if n not in tp.VARIANTS]
    assert not unknown, unknown
    tried = [n for n in names if n != "baseline"]
    assert len(tried) == len(set(tried)) >= 40
    assert names.count("baseline") >= len(tried) // 10


def test_a_variant_applied_is_restored_after_its_block():
    """tiling_probe.applied (the probe's loop and graph_timeline --variant): the variant's knobs
    set inside the block, every one back to its value after it, an error inside included."""
    from sgl_kernel_ext.triton import attn_out

    modules = tp.knob_modules()
    derived = tp.derived_values(modules)
    before = attn_out.MAX_ROWS, attn_out.BLOCK_N
    with tp.applied("vo_one_launch_128", modules, derived):
        assert (attn_out.MAX_ROWS, attn_out.BLOCK_N) == (16, 128)
    assert (attn_out.MAX_ROWS, attn_out.BLOCK_N) == before
    with pytest.raises(RuntimeError):
        with tp.applied("vo_one_launch", modules, derived):
            raise RuntimeError("a failed run")
    assert (attn_out.MAX_ROWS, attn_out.BLOCK_N) == before


def test_variants_of_build_time_knobs_build_their_own_layers():
    """A variant that sets a knob the layer reads at build (every sm90 opt-in, the launch
    shapes) must get layers of its own, or it times the baseline again (sm90_moe did so on
    2026-12-02); one that sets only launch-time knobs reuses the baseline's."""
    for name, sets in tp.VARIANTS.items():
        if any(mod == "sm90" for mod, _ in sets):
            assert name in tp.BUILD_VARIANTS, name
    assert {"sm90_moe", "sm90_moe_two_launches", "sm90_o_proj"} <= tp.BUILD_VARIANTS
    assert "baseline" not in tp.BUILD_VARIANTS


def test_no_variant_is_written_twice():
    """A variant named twice in tiling_probe.VARIANTS' literal silently keeps only the later
    knobs (found 2026-12-03: router_route_*_warps added a second time)."""
    import ast

    tree = ast.parse(Path(tp.__file__).read_text())
    dicts = [node.value for node in tree.body if isinstance(node, ast.Assign)
             and any(getattr(t, "id", "") == "VARIANTS" for t in node.targets)]
    assert len(dicts) == 1 and isinstance(dicts[0], ast.Dict)
    names = [k.value for k in dicts[0].keys if isinstance(k, ast.Constant)]
    assert len(names) > 50 and len(names) == len(set(names)), \
        sorted(n for n in set(names) if names.count(n) > 1)


def test_every_variant_sets_a_knob_that_exists():
    """Each variant's (module, attribute) exists, and a callable it puts in place of a
    function takes that function's positional arguments (down_block_64 took one argument
    after down_block gained `dense`, and crashed a device call on 2026-12-04)."""
    import inspect

    modules = tp.knob_modules()
    derived = tp.derived_values(modules)
    for name, sets in tp.VARIANTS.items():
        for (mod, attr), value in sets.items():
            assert mod in modules and hasattr(modules[mod], attr), (name, mod, attr)
            original = getattr(modules[mod], attr)
            if isinstance(value, str) and callable(original):
                assert value in derived, (name, value)
                want = [p for p in inspect.signature(original).parameters.values()
                        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                got = inspect.signature(derived[value])
                got.bind(*range(len(want)))  # raises if it cannot take them


def test_layer_benchmarks_share_their_inputs():
    """harness.layer_inputs: decode_layer's and tiling_probe's step inputs, one function, a
    seed per (rows, context), so the probe's baseline routes as the release table does."""
    import torch

    from benchmark import harness as H
    from sglang.srt.layers.fused_decode.reference.config import tiny_config

    cfg, cpu = tiny_config(), torch.device("cpu")
    hid, res, tprev = H.layer_inputs(cfg, 3, 40, cpu)
    assert hid.shape == res.shape == (3, cfg.hidden_size) and hid.dtype == torch.bfloat16
    assert tprev.shape == (3, cfg.index_topk)
    again = H.layer_inputs(cfg, 3, 40, cpu)
    assert all(torch.equal(a, b) for a, b in zip((hid, res, tprev), again))
    assert not torch.equal(H.layer_inputs(cfg, 3, 41, cpu)[0], hid)
    assert not torch.equal(H.layer_inputs(cfg, 4, 40, cpu)[0][:3], hid)
    source = (Path(tp.__file__).parent / "decode_layer.py").read_text()
    probe = Path(tp.__file__).read_text()
    assert "H.layer_inputs(" in source and "H.layer_inputs(" in probe
    assert "manual_seed(m)" not in probe


class _Layer:
    def __init__(self, chosen):
        self.experts = chosen is not None
        self.chosen = chosen

    def routed_experts(self, m):
        import torch

        return torch.tensor(self.chosen)[:m]


def test_experts_touched_is_the_mean_of_each_moe_layers_distinct_choices():
    from benchmark import harness as H

    a = _Layer([[1, 2, -1], [2, 5, 7]])  # a row that chose fewer: -1 pads
    b = _Layer([[3, 4, 5], [3, 4, 6]])
    assert H.experts_touched([a, _Layer(None), b], 2) == (4 + 4) / 2
    assert H.experts_touched([a], 1) == 2
    assert H.experts_touched([_Layer(None)], 2) is None


def test_probe_runs_its_variants_through_on_cpu(tmp_path, monkeypatch):
    """tiling_probe's main path (layers, decode_layer's inputs, the floor of the experts the
    step touched, a variant's knobs set and restored, the results file) at the tiny config
    under the interpreter, the GPU's calls stubbed: a mistake here would otherwise cost a
    device call to find."""
    import json

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPU present: the probe itself runs there")
    from benchmark import harness as H
    from sglang.srt.layers.fused_decode.reference import config as C
    from sgl_kernel_ext.triton import mla

    class OnCpu:  # the probe's torch, its "cuda" device the CPU
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def device(kind):
            return torch.device("cpu" if kind == "cuda" else kind)

    monkeypatch.setattr(tp, "torch", OnCpu())
    monkeypatch.setattr(C, "glm53_config", C.tiny_config)
    monkeypatch.setattr(H, "measure_bandwidth", lambda dev, *a, **k: 4.0e12)
    monkeypatch.setattr(H, "time_graph", lambda fn, replays: (2.0, None))
    monkeypatch.setattr(H, "run_meta", lambda dev: {})
    gen_base = H.gen_base
    monkeypatch.setattr(H, "gen_base", lambda cfg, lid, seed, tp_size, dev:
                        gen_base(cfg, lid, seed, 1, dev))  # the tiny config splits 1 way
    before = mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS
    monkeypatch.setattr("sys.argv", ["tiling_probe", "--kinds", "moe", "--ms", "2",
                                     "--variants", "baseline,absorb_late_dependents",
                                     "--ctx", "40", "--copies", "1", "--out", str(tmp_path),
                                     "--results", str(tmp_path)])
    tp.main()
    assert mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS == before
    rows = json.loads(next(tmp_path.glob("tiling_probe_*.json")).read_text())["results"]
    assert [r["variant"] for r in rows] == ["baseline", "absorb_late_dependents"]
    for r in rows:
        assert r["us"] == 2.0 and 4 <= r["experts_touched"] <= 8  # 2 rows x top-4 of 16
        assert r["floor_us"] > 0 and r["fraction_of_floor"] == r["floor_us"] / 2.0


def test_decode_layer_times_its_fused_arms_under_a_variant(monkeypatch):
    """decode_layer --variant: its run sees the variant's knobs (an opt-in form's release
    table, e.g. attn_out's one launch), restored after it; the default is the baseline."""
    from benchmark import decode_layer
    from sgl_kernel_ext.triton import attn_out

    before = attn_out.MAX_ROWS
    seen = []
    monkeypatch.setattr(decode_layer, "run",
                        lambda args: seen.append((args.variant, attn_out.MAX_ROWS)))
    decode_layer.main(["--variant", "vo_one_launch"])
    decode_layer.main([])
    assert seen == [("vo_one_launch", 16), ("baseline", before)] and attn_out.MAX_ROWS == before
