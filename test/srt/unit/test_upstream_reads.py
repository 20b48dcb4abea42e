"""Contract: every upstream name the fork reads exists in the installed upstream, and the
fork's code reads nothing undeclared; the runtime and the extension read nothing at all."""

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

from sglang.srt.models.glm5_mega.upstream_reads import (
    SERVER_ARGS_FIELDS,
    SIGNATURES,
    UPSTREAM_READS,
)

REPO = Path(__file__).resolve().parents[3]
MODEL_PKG = REPO / "python/sglang/srt/models/glm5_mega"
RUNTIME_PKG = REPO / "python/sglang/srt/layers/fused_decode"
EXT_PKG = REPO / "sgl-kernel-ext/sgl_kernel_ext"
FORK_OWNED = ("sglang.srt.models.glm5_mega", "sglang.srt.layers.fused_decode")


def _resolve(module, path):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("module, path", UPSTREAM_READS)
def test_declared_read_exists(module, path):
    _resolve(module, path)


@pytest.mark.parametrize("key", sorted(SIGNATURES))
def test_declared_signature_matches(key):
    params = tuple(inspect.signature(_resolve(*key)).parameters)
    assert params == SIGNATURES[key]


def test_server_args_fields_exist():
    from sglang.srt.arg_groups.arg_utils import field_names
    from sglang.srt.server_args import ServerArgs

    missing = set(SERVER_ARGS_FIELDS) - field_names(ServerArgs)
    assert not missing


def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False


def _upstream_reads_in(path):
    """(module, name) pairs a file reads from upstream sglang: ``from m import n`` and
    ``alias.n`` where alias is an upstream module imported with ``from pkg import mod``."""
    tree = ast.parse(path.read_text())
    reads, module_aliases = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sglang") and not alias.name.startswith(FORK_OWNED):
                    reads.add((alias.name, "*"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            if node.module.startswith(FORK_OWNED):
                continue
            for alias in node.names:
                qualified = f"{node.module}.{alias.name}"
                if _is_module(qualified):
                    module_aliases[alias.asname or alias.name] = qualified
                else:
                    reads.add((node.module, alias.name))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in module_aliases
        ):
            reads.add((module_aliases[node.value.id], node.attr))
    return reads


def test_model_package_reads_only_declared_names():
    declared = set(UPSTREAM_READS)
    found = set()
    for path in sorted(MODEL_PKG.glob("*.py")):
        found |= _upstream_reads_in(path)
    assert found, "the scan found no upstream read at all; is it broken?"
    assert found <= declared, f"undeclared upstream reads: {sorted(found - declared)}"


@pytest.mark.parametrize("root", [RUNTIME_PKG, EXT_PKG], ids=["fused_decode", "sgl_kernel_ext"])
def test_runtime_and_extension_import_no_upstream(root):
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                if name.split(".")[0] == "sglang" and not name.startswith(FORK_OWNED[1]):
                    offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert not offenders
