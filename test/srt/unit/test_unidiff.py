"""The strict patch applier: exact positions, no fuzz, errors that name patch, file and hunk."""

import pytest

from tools.forkbuild.unidiff import PatchError, apply_file_patch, parse_patch

BASE = "".join(f"line {i}\n" for i in range(1, 21))
PATCH = """Subject: demo

diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -2,3 +2,4 @@
 line 2
 line 3
+added after 3
 line 4
@@ -10,3 +11,3 @@ def f():
 line 10
-line 11
+line eleven
 line 12
"""


def _fp():
    return parse_patch("0001-demo.patch", PATCH).files[0]


def test_applies_exactly():
    out = apply_file_patch("0001-demo.patch", _fp(), BASE).splitlines()
    assert out[3] == "added after 3" and out[11] == "line eleven" and len(out) == 21


def test_header_is_kept_apart_from_the_diff():
    patch = parse_patch("0001-demo.patch", PATCH)
    assert patch.header.startswith("Subject: demo") and patch.files[0].path == "pkg/mod.py"


def test_shifted_context_is_refused_and_located():
    shifted = "extra\n" + BASE
    with pytest.raises(PatchError) as err:
        apply_file_patch("0001-demo.patch", _fp(), shifted)
    message = str(err.value)
    assert "patch 0001-demo.patch" in message and "file pkg/mod.py" in message
    assert "hunk #1 (@@ -2,3 +2,4 @@)" in message and "at line 3 instead" in message


def test_changed_context_is_refused_no_fuzz():
    changed = BASE.replace("line 12\n", "line twelve\n")
    with pytest.raises(PatchError) as err:
        apply_file_patch("0001-demo.patch", _fp(), changed)
    assert err.value.hunk == 2 and "not in the file" in err.value.reason


def test_missing_file_and_malformed_hunk():
    with pytest.raises(PatchError, match="does not exist"):
        apply_file_patch("p", _fp(), None)
    broken = PATCH.replace("@@ -2,3 +2,4 @@", "@@ -2,3 +2,5 @@")
    with pytest.raises(PatchError, match="header says"):
        parse_patch("p", broken)


def test_new_file_and_missing_newline():
    text = (
        "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n"
    )
    fp = parse_patch("p", text).files[0]
    assert fp.old_path is None
    assert apply_file_patch("p", fp, None) == "a\nb"
    with pytest.raises(PatchError, match="already exists"):
        apply_file_patch("p", fp, "x\n")
