"""Arm (b): upstream SGLang 0.5.23's own Triton kernels, taken from its wheel at run time.

Nothing of upstream is kept in this repository. On the dev machine:

    python -m benchmark.upstream extract --wheel <sglang-0.5.23 wheel> --dest .cache/upstream

copies a few pure-Python files (and the H200 MoE tuning JSONs) out of the wheel into the
ignored `.cache/upstream/`; the device call carries that folder. `load_ops` imports those files
by path under their own `sglang.*` names, with every other `sglang.*` / `sgl_kernel` /
`deep_gemm` module they import replaced by a stub (attributes are inert: calls return stubs,
truth value False, a stub called on a function returns it unchanged so decorators pass), so
no compiled extension is needed. The report says which modules and kernels imported and ran.

Used from upstream: `_per_token_group_quant_8bit_raw` (Triton per-token-group FP8 quant; on
CUDA SGLang itself launches a JIT CUDA kernel, not importable here),
`w8a8_block_fp8_matmul_triton` (block-FP8 GEMM; on H200 SGLang prefers DeepGEMM, not
importable), `invoke_fused_moe_kernel` + `act_and_mul_triton` + `moe_sum_reduce_triton` (the
Triton fused-MoE path, with the H200 tuned configs for E=257, N=256). SGLang's
`moe_align_block_size` is a CUDA JIT kernel: here a one-launch Triton kernel of this module
computes the same sorted_token_ids / expert_ids / num_tokens_post_padded. The fused MoE reads
SGLang's stacked expert layout ([E+1, 2I, H] with the shared expert last), so this arm builds
that copy of each layer's experts once (not counted in its time).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import traceback
import types
import zipfile
from pathlib import Path

import torch
import triton
import triton.language as tl

MODULES = {
    "gemm": "sglang.kernels.ops.gemm.fp8_kernel",
    "quant": "sglang.kernels.ops.quantization.fp8_kernel",
    "moe": "sglang.kernels.ops.moe.fused_moe_triton_kernels",
}
FILES = [m.replace(".", "/") + ".py" for m in MODULES.values()] + [
    "sglang/kernels/ops/quantization/fp8_utils.py",
    "sglang/kernels/ops/quantization/int8_kernel.py",
]
MOE_CONFIG_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_5_1/"
MOE_CONFIGS = {
    "up": MOE_CONFIG_DIR + "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json",
    "down": MOE_CONFIG_DIR + "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json",
}
KERNEL_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
OWN = ("sglang.srt.layers.fused_decode", "sglang.srt.models.glm5_mega")
NAMESPACES = ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.models")


def extract(wheel: str, dest: str) -> dict:
    dest_p = Path(dest)
    dest_p.mkdir(parents=True, exist_ok=True)
    data = Path(wheel).read_bytes()
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        got = []
        for f in FILES + list(MOE_CONFIGS.values()):
            if f in names:
                z.extract(f, dest_p)
                got.append(f)
    manifest = {"wheel": Path(wheel).name, "sha256": hashlib.sha256(data).hexdigest(),
                "files": got, "missing": [f for f in FILES + list(MOE_CONFIGS.values()) if f not in got]}
    (dest_p / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# ------------------------------------------------------------------ stub import machinery
class Stub:
    """An inert stand-in for anything an upstream module imports that is not carried."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *a, **k):
        if len(a) == 1 and not k and callable(a[0]) and not isinstance(a[0], Stub):
            return a[0]  # used as a decorator
        return Stub(self._name + "()")

    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return Stub(f"{self._name}.{n}")

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<stub {self._name}>"


class StubModule(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return Stub(f"{self.__name__}.{n}")


class _StubLoader(importlib.abc.Loader):
    def __init__(self, stubbed):
        self.stubbed = stubbed

    def create_module(self, spec):
        m = StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        self.stubbed.append(module.__name__)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path):
        self.root, self.stubbed = root, []

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in ("sglang", "sgl_kernel", "deep_gemm", "flashinfer", "aiter", "tvm_ffi"):
            return None
        if name in NAMESPACES or name.startswith(OWN):
            return None
        f = self.root / (name.replace(".", "/") + ".py")
        if f.exists():
            return importlib.util.spec_from_file_location(name, f)
        return importlib.machinery.ModuleSpec(name, _StubLoader(self.stubbed), is_package=True)


# ------------------------------------------------------------------ MoE alignment (own kernel)
@triton.jit
def _align(ids_ptr, sorted_ptr, eids_ptr, ntpp_ptr, P, BM: tl.constexpr, PP: tl.constexpr):
    """Group the P (row, expert) pairs by expert into BM-row blocks (each expert has <= BM)."""
    i = tl.arange(0, PP)
    valid = i < P
    for j in range(0, P * BM, PP):
        tl.store(sorted_ptr + j + i, P, mask=j + i < P * BM)
    tl.store(eids_ptr + i, -1, mask=valid)
    tl.debug_barrier()
    e = tl.load(ids_ptr + i, mask=valid, other=1 << 30)
    same = e[:, None] == e[None, :]
    before = i[None, :] < i[:, None]
    pos = tl.sum((same & before).to(tl.int32), 1)
    first = (pos == 0) & valid
    first_c = tl.reshape(first, (1, PP))
    grp = tl.sum(((e[None, :] < e[:, None]) & first_c).to(tl.int32), 1)
    tl.store(sorted_ptr + grp * BM + pos, i, mask=valid)
    tl.store(eids_ptr + grp, e, mask=first)
    tl.store(ntpp_ptr, tl.sum(first.to(tl.int32), 0) * BM)


def align(ids_all: torch.Tensor, block_m: int):
    p = ids_all.numel()
    sorted_ids = torch.empty(p * block_m, dtype=torch.int32, device=ids_all.device)
    eids = torch.empty(p, dtype=torch.int32, device=ids_all.device)
    ntpp = torch.empty(1, dtype=torch.int32, device=ids_all.device)
    _align[(1,)](ids_all, sorted_ids, eids, ntpp, p, block_m, triton.next_power_of_2(p),
                 num_warps=8)
    return sorted_ids, eids, ntpp


# ------------------------------------------------------------------ ops
def load_ops(root: str):
    """(Ops or None, report) for arm (b)."""
    from .stock import Ops

    rootp = Path(root)
    report = {"root": str(root), "modules": {}, "stubbed": [], "used": {}}
    man = rootp / "MANIFEST.json"
    if not man.exists():
        report["error"] = f"{root}/MANIFEST.json missing: run `python -m benchmark.upstream extract`"
        return None, report
    report["manifest"] = json.loads(man.read_text())
    finder = _Finder(rootp)
    sys.meta_path.insert(0, finder)
    mods = {}
    try:
        for key, name in MODULES.items():
            try:
                mods[key] = importlib.import_module(name)
                report["modules"][name] = "imported"
            except Exception as e:
                report["modules"][name] = f"failed: {type(e).__name__}: {e}"
                traceback.print_exc()
    finally:
        sys.meta_path.remove(finder)
        report["stubbed"] = sorted(set(finder.stubbed))
    cfgs = {}
    for k, f in MOE_CONFIGS.items():
        p = rootp / f
        if p.exists():
            cfgs[k] = {int(m): {kk: v for kk, v in c.items() if kk in KERNEL_KEYS}
                       for m, c in json.loads(p.read_text()).items()}
    report["moe_configs"] = {k: MOE_CONFIGS[k].split("/")[-1] for k in cfgs}

    from . import stock_kernels as K

    q = mods.get("quant")
    g = mods.get("gemm")
    mo = mods.get("moe")
    if g is not None:
        g.get_device_name = lambda: (torch.cuda.get_device_name() if torch.cuda.is_available()
                                     else "cpu")  # the stub would name no GPU
    used = report["used"]

    if q is not None and hasattr(q, "_per_token_group_quant_8bit_raw"):
        def quant(x):
            return q._per_token_group_quant_8bit_raw(x.contiguous(), 128, 1e-10, torch.float8_e4m3fn)
        used["quant"] = "upstream _per_token_group_quant_8bit_raw (Triton)"
    else:
        quant = K.act_quant
        used["quant"] = "stock (upstream quant did not import)"

    if g is not None and hasattr(g, "w8a8_block_fp8_matmul_triton"):
        def gemm(aq, a_s, w):
            return g.w8a8_block_fp8_matmul_triton(aq, w.q, a_s, w.s, [128, 128], torch.bfloat16)
        used["gemm"] = "upstream w8a8_block_fp8_matmul_triton (Triton)"
    else:
        def gemm(aq, a_s, w):
            return K.fp8_gemm(aq, a_s, w.q, w.s)
        used["gemm"] = "stock (upstream GEMM did not import)"

    if mo is not None and hasattr(mo, "invoke_fused_moe_kernel") and "up" in cfgs and "down" in cfgs:
        def pick(c, m):
            return c[min(c, key=lambda k: abs(k - m))]

        def moe(xq, xs, x, ids, wts, table, mw):
            m, h = xq.shape
            if mw.stacked is None:
                mw.stacked = stack_experts(mw)
            w13q, w13s, w2q, w2s = mw.stacked
            inter = w2q.shape[2]
            slots = ids.shape[1]
            cu, cd = pick(cfgs["up"], m), pick(cfgs["down"], m)
            assert cu["BLOCK_SIZE_M"] >= m and cd["BLOCK_SIZE_M"] == cu["BLOCK_SIZE_M"]
            sorted_ids, eids, ntpp = align(ids, cu["BLOCK_SIZE_M"])
            c1 = torch.empty(m * slots, 2 * inter, dtype=torch.bfloat16, device=xq.device)
            mo.invoke_fused_moe_kernel(xq, w13q, None, c1, xs, w13s, None, wts, ids, sorted_ids,
                                       eids, ntpp, False, slots, cu, tl.bfloat16, True, False,
                                       False, False, False, [128, 128])
            act = torch.empty(m * slots, inter, dtype=torch.bfloat16, device=xq.device)
            mo.act_and_mul_triton(c1, act, cu)
            aq, a_s = quant(act)
            c2 = torch.empty(m, slots, h, dtype=torch.bfloat16, device=xq.device)
            mo.invoke_fused_moe_kernel(aq, w2q, None, c2.view(m * slots, h), a_s, w2s, None, wts,
                                       ids, sorted_ids, eids, ntpp, True, 1, cd, tl.bfloat16,
                                       True, False, False, False, False, [128, 128])
            out = torch.empty(m, h, dtype=torch.bfloat16, device=xq.device)
            mo.moe_sum_reduce_triton(c2, out, 1.0)
            return out
        used["moe"] = ("upstream invoke_fused_moe_kernel + act_and_mul_triton + moe_sum_reduce_triton"
                       " (Triton, H200 configs E=257,N=256); alignment: this module's Triton kernel")
    else:
        moe = None
        used["moe"] = "stock (upstream fused MoE did not import)"
    if moe is None:
        from .stock import _stock_moe as moe
    if all(v.startswith("stock") for v in used.values()):
        return None, report
    return Ops("upstream", quant, gemm, moe), report


def stack_experts(mw):
    """SGLang's layout of one layer's experts: w13 [E+1, 2I, H], w2 [E+1, H, I], shared last."""
    e, it, h = mw.gate.q.shape
    dev = mw.gate.q.device
    w13q = torch.empty(e + 1, 2 * it, h, dtype=mw.gate.q.dtype, device=dev)
    w13s = torch.empty(e + 1, 2 * it // 128, h // 128, dtype=torch.float32, device=dev)
    sb = it // 128
    w13q[:e, :it], w13q[:e, it:], w13q[e, :it], w13q[e, it:] = mw.gate.q, mw.up.q, mw.sh_gate.q, mw.sh_up.q
    w13s[:e, :sb], w13s[:e, sb:], w13s[e, :sb], w13s[e, sb:] = mw.gate.s, mw.up.s, mw.sh_gate.s, mw.sh_up.s
    w2q = torch.cat([mw.down.q, mw.sh_down.q.unsqueeze(0)])
    w2s = torch.cat([mw.down.s, mw.sh_down.s.unsqueeze(0)])
    return w13q, w13s, w2q, w2s


def main():
    p = argparse.ArgumentParser(description="extract upstream SGLang's Triton kernel files")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("--wheel", required=True)
    e.add_argument("--dest", default=".cache/upstream")
    a = p.parse_args()
    print(json.dumps(extract(a.wheel, a.dest), indent=1))


if __name__ == "__main__":
    main()
