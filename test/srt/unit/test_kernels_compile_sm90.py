"""Every Triton kernel launch of the fused layer compiles for sm_90 (H100/H200), checked on
a CPU machine: the interpreter cannot see compile-only errors (sm90_compile.py says how). At
the tiny config every launch, the persistent kernel and the knobs' other forms included; at
one GLM-5.3 TP8 rank's real shapes the stage kernels, whose shared memory must fit a block
(a pipelined loop over real tiles asked 290 KB once; only the real tile sizes show it)."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(mode, specs, interpret):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(HERE / "sm90_compile.py"), mode, str(specs)],
                          capture_output=True, text=True, timeout=900, env=env)


def _record_and_compile(record_mode, tmp_path):
    specs = tmp_path / "specs.json"
    recorded = _run(record_mode, specs, interpret=True)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    assert "distinct launches" in recorded.stdout
    compiled = _run("compile", specs, interpret=False)
    assert compiled.returncode == 0, compiled.stdout[-4000:] + compiled.stderr[-2000:]
    assert "FAIL" not in compiled.stdout


def test_every_launch_compiles_for_sm90(tmp_path):
    _record_and_compile("record", tmp_path)


def test_every_real_shape_stage_launch_fits_sm90(tmp_path):
    _record_and_compile("record-real-stages", tmp_path)


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
