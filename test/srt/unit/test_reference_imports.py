"""The reference imports no upstream SGLang module (only torch, safetensors, the standard
library and its own modules), so it runs on a GPU machine that has only torch and triton."""

import ast
import sys
from pathlib import Path

import sglang.srt.layers.fused_decode.reference as ref

ALLOWED = {"torch", "safetensors"}


def test_reference_imports_only_torch_safetensors_stdlib():
    files = sorted(Path(ref.__file__).parent.glob("*.py"))
    assert len(files) >= 10
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: the reference's own modules
                    continue
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top not in ALLOWED and top not in sys.stdlib_module_names and top != "__future__":
                    bad.append(f"{f.name}: {n}")
    assert not bad, bad
