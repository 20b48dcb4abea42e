"""Every Triton kernel launch of the fused layer compiles for sm_90 (H100/H200), checked on
a CPU machine: the interpreter cannot see compile-only errors (sm90_compile.py says how). At
the tiny config every launch, the persistent kernel and the knobs' other forms included; at
one GLM-5.3 TP8 rank's real shapes the stage kernels, whose shared memory must fit a block
(a pipelined loop over real tiles asked 290 KB once; only the real tile sizes show it).

Both with this venv's Triton and, when installed (``.ci/run`` installs it), with the GPU
machine's (``DEVICE_TRITON``): the two versions accept different code, and a kernel that
only the GPU's rejects would otherwise cost a device call to find."""

import os
import sys
from pathlib import Path

import pytest

from compile_runs import compile_every, run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# the Triton of the lent GPU machine (its image's pip list), and where .ci/run installs it
DEVICE_TRITON = "3.6.0"
DEVICE_TRITON_DIR = ROOT / ".cache" / f"triton-{DEVICE_TRITON}"


def test_every_launch_compiles_for_sm90(tiny_launch_specs):
    compile_every(tiny_launch_specs)


def test_every_real_shape_stage_launch_fits_sm90(real_stage_specs):
    compile_every(real_stage_specs)


def _resident_forms(specs, triton_dir=None):
    """sm90_compile's ``resident`` verdicts on attn_out's recorded forms: (verdict, default)
    a form, after checking its summary line."""
    checked = run("resident", specs, triton_dir=triton_dir)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    lines = checked.stdout.strip().splitlines()
    forms = [(line.split(":")[0].split()[0], "default" in line.split(":")[0])
             for line in lines if line.startswith(("fits", "refused"))]
    fits = sum(verdict == "fits" for verdict, _ in forms)
    assert lines[-1] == f"resident {fits} of {len(forms)}" and len(forms) >= 5, lines[-1]
    return forms


def _assert_defaults_fit(forms):
    from sgl_kernel_ext.triton import attn_out

    defaults = [verdict for verdict, default in forms if default]
    if attn_out.MAX_ROWS >= 1:
        assert defaults, "no recorded form of attn_out is the one its knobs launch"
    assert all(verdict == "fits" for verdict in defaults), forms


def test_the_one_launchs_default_form_fits_an_h200_at_once(real_stage_specs):
    """attn_out's programs wait for each other inside the launch: the form its knobs launch
    (attn_out.BLOCK_N, W_EARLY, at up to MAX_ROWS rows) at one TP8 rank must have every
    program resident at once on an H200 (ptxas' registers and the shared memory against its
    multiprocessors), or its first launch on the GPU refuses. The other recorded forms are
    reported, not required: which fit depends on the Triton that compiles them."""
    _assert_defaults_fit(_resident_forms(real_stage_specs))


@pytest.mark.skipif(not (DEVICE_TRITON_DIR / "triton").is_dir(),
                    reason=f"the GPU machine's Triton {DEVICE_TRITON} is not installed at "
                           f"{DEVICE_TRITON_DIR.relative_to(ROOT)} (.ci/run installs it)")
def test_the_one_launchs_default_form_fits_with_the_gpu_machines_triton(real_stage_specs):
    """As above with the Triton the GPU runs: this venv's newer Triton compiled the 16-row
    forms of 256 and 128 columns to 78-111 registers, where the H200's 3.6 gave 128-146 and
    refused them (pytest_vo_c01c8f7.log); the GPU's Triton on this CPU counts the same."""
    forms = _resident_forms(real_stage_specs, triton_dir=DEVICE_TRITON_DIR)
    _assert_defaults_fit(forms)
    assert any(verdict == "refused" for verdict, _ in forms), \
        "no recorded form refused: the GPU's Triton refused three of them on the H200"


@pytest.mark.skipif(not (DEVICE_TRITON_DIR / "triton").is_dir(),
                    reason=f"the GPU machine's Triton {DEVICE_TRITON} is not installed at "
                           f"{DEVICE_TRITON_DIR.relative_to(ROOT)} (.ci/run installs it)")
def test_every_real_shape_stage_launch_compiles_with_the_gpu_machines_triton(real_stage_specs):
    assert compile_every(real_stage_specs, triton_dir=DEVICE_TRITON_DIR) == DEVICE_TRITON


def _square_minus(spec, target):
    return (spec * spec - target, os.getpid())


def test_each_compiled_keeps_the_order_across_worker_processes(monkeypatch):
    """sm90_compile's ``each_compiled`` (every compile mode's loop): the results in the specs'
    order, from more than one worker process when JOBS allows, as the serial loop gives."""
    sys.path.insert(0, str(HERE))
    import sm90_compile

    specs = list(range(40))
    monkeypatch.setattr(sm90_compile, "JOBS", 1)
    serial = sm90_compile.each_compiled(specs, 3, _square_minus)
    monkeypatch.setattr(sm90_compile, "JOBS", 4)
    pooled = sm90_compile.each_compiled(specs, 3, _square_minus)
    assert [v for v, _ in pooled] == [v for v, _ in serial] == [s * s - 3 for s in specs]
    assert {pid for _, pid in serial} == {os.getpid()}
    assert os.getpid() not in {pid for _, pid in pooled}


def test_sass_loops_counts_each_loop_body_by_class():
    """sm90_compile's ``loops``: a branch back to an earlier label is a loop, its body's
    instructions counted by class; a forward branch is not."""
    sys.path.insert(0, str(HERE))
    import sm90_compile

    listing = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0030*/               @P0 IMAD R3, R3, 0x2, RZ ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/               @!P1 BRA `(.L_x_0) ;
        /*0060*/                   BRA `(.L_x_1) ;
.L_x_1:
        /*0070*/                   EXIT ;
"""
    (loop,) = sm90_compile.sass_loops(listing)
    assert loop["lines"] == (2, 7) and loop["instructions"] == 5
    assert (loop["mma"], loop["async_copy"], loop["integer"], loop["barrier"], loop["other"]) \
        == (1, 1, 1, 1, 1)
    assert loop["global_load"] == loop["float"] == loop["shared"] == 0


def test_sass_instructions_drop_addresses_and_keep_only_instructions():
    """sm90_compile's ``sass``: the instruction lines of a listing, addresses dropped, so two
    builds of the same kernel compare equal line for line."""
    sys.path.insert(0, str(HERE))
    import sm90_compile

    listing = """
\t.text._k:
.L_x_0:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/               @!P1 BRA `(.L_x_0) ;
"""
    moved = listing.replace("/*0000*/", "/*0100*/").replace("/*0010*/", "/*0110*/")
    lines = sm90_compile.sass_instructions(listing)
    assert lines == ["MOV R1, c[0x0][0x28] ;", "@!P1 BRA `(.L_x_0) ;"]
    assert sm90_compile.sass_instructions(moved) == lines

