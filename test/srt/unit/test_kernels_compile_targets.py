"""The portable Triton kernels compile for the GPUs the next backends bring, checked on CPU.

DESIGN's layout keeps ``sgl_kernel_ext/triton/`` free of vendor-only intrinsics so that a
Blackwell or AMD backend starts from the same sources (issue 5). This holds that to the
compiler: every launch of the fused layer (the tiny config's, the knobs' other forms and the
persistent kernel included) and every stage kernel at one GLM-5.3 TP8 rank's real shapes
compiles with this venv's Triton for B200 (sm_100, with the overlap, as on Hopper) and for
MI355X (gfx950, the declared ``amd/gfx950`` target, without it: ``overlap.enabled`` is off
there), each launch within that GPU's shared memory (LDS) a block, and attn_out's one launch
(its programs wait for each other) all resident at once on a B200. Nothing here runs them.
"""

import json

import pytest

from compile_runs import compile_every, run

TARGETS = ("sm100", "gfx950")


@pytest.mark.parametrize("target", TARGETS)
def test_every_launch_compiles_for(target, tiny_launch_specs):
    compile_every(tiny_launch_specs, target)


@pytest.mark.parametrize("target", TARGETS)
def test_every_real_shape_stage_launch_fits(target, real_stage_specs):
    compile_every(real_stage_specs, target)


def test_every_real_shape_form_of_the_one_launch_fits_a_b200_at_once(real_stage_specs):
    """attn_out's programs wait for each other inside the launch, so on Blackwell too each
    recorded form at one TP8 rank must have every program resident at once (ptxas' sm_100a
    registers and the shared memory against a B200's 148 multiprocessors)."""
    checked = run("resident", real_stage_specs, "sm100")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    summary = checked.stdout.strip().splitlines()[-1]
    assert summary.startswith("resident ") and int(summary.split()[1]) >= 5, summary


def test_an_nvidia_only_form_is_refused_for_amd(real_stage_specs, tmp_path):
    """The check can fail: a stage kernel compiled with the overlap on (griddepcontrol and the
    bulk L2 prefetch, NVIDIA's PTX) does not compile for gfx950."""
    specs = json.loads(real_stage_specs.read_text())
    spec = next(s for s in specs if s["name"] == "_fp8_linear_kernel")
    nvidia = dict(spec, constexprs=dict(spec["constexprs"], PDL=True))
    path = tmp_path / "nvidia_form.json"
    path.write_text(json.dumps([spec, nvidia]))
    compiled = run("compile", path, "gfx950")
    lines = compiled.stdout.strip().splitlines()
    assert compiled.returncode == 1, compiled.stdout[-3000:] + compiled.stderr[-2000:]
    assert lines[0].startswith("ok   _fp8_linear_kernel") and lines[1].startswith("FAIL "), lines
    assert lines[-1].startswith("compiled 1 of 2 for gfx950"), lines[-1]
