"""The patch tool: ``check``, ``refresh`` and ``rebase`` of the series against upstream.

    python tools/patchtool check [--scratch DIR]
        Apply the series to the pinned upstream wheel with no fuzz, report each patch; with
        --scratch, also leave a git tree there (upstream commit, then one commit a patch).
    python tools/patchtool refresh --scratch DIR
        Rewrite patches/ from the scratch tree's commits (edit them with git: amend, fixup,
        add commits whose first message line is a new patch's file name).
    python tools/patchtool rebase --to VERSION [--upstream-tree PATH] [--dry-run]
        Carry the series onto another upstream release (its wheel from the package index, or
        a local upstream ``python/`` tree), 3-way through git; list every conflict by patch
        and file; on success rewrite the patches and the pin.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from .gitscratch import Scratch
from .pin import Pin, PinError, fetch_wheel, index_wheels, interpreter_tag, read_pin, render_pin
from .series import apply_series, header_fields, load_series, series_names
from .unidiff import PatchError, apply_patch, parse_patch

REPO = Path(__file__).resolve().parents[2]


def _wheel_files(wheel: Path, paths: Optional[set[str]] = None) -> dict[str, bytes]:
    """Files of the wheel's packages (no dist-info); only paths when given."""
    with zipfile.ZipFile(wheel) as z:
        return {
            info.filename: z.read(info)
            for info in z.infolist()
            if not info.is_dir()
            and ".dist-info/" not in info.filename
            and (paths is None or info.filename in paths)
        }


def _pinned_wheel(pin: Pin) -> Path:
    return fetch_wheel(pin.wheel_for(interpreter_tag()), log=lambda m: print(f"  {m}"))


def cmd_check(repo: Path, scratch_dir: Optional[Path]) -> int:
    pin = read_pin(repo / "UPSTREAM.toml")
    print(f"check: patches/series against upstream {pin.name} {pin.version}")
    wheel = _pinned_wheel(pin)
    patches = load_series(repo / "patches")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())

        def read(path):
            return z.read(path).decode() if path in names else None

        try:
            _, reports = apply_series(patches, read)
        except PatchError as exc:
            print(f"  FAILED {exc}")
            return 1
    for r in reports:
        print(f"  {r.name}: applies with no fuzz ({r.hunks} hunks; {', '.join(r.files)})")
    print(f"check: OK, {len(reports)} patches, fork version {pin.fork_version}")
    if scratch_dir:
        scratch = Scratch.create(
            scratch_dir, _wheel_files(wheel), f"upstream {pin.name} {pin.version}"
        )
        for patch in patches:
            changed: dict = {}
            apply_patch(patch, scratch.read, changed)
            scratch.commit_patch(patch, changed)
        print(f"scratch tree: {scratch_dir} (tag 'upstream', one commit per patch)")
    return 0


def cmd_refresh(repo: Path, scratch_dir: Path) -> int:
    scratch = Scratch(scratch_dir)
    dirty = scratch.dirty_files()
    if dirty:
        print(f"refresh: refused, uncommitted changes in the scratch tree: {dirty}; commit "
              "each into the patch it belongs to")
        return 1
    patches_dir = repo / "patches"
    old = set(series_names(patches_dir)) if (patches_dir / "series").is_file() else set()
    names = []
    for commit in scratch.patch_commits():
        name, text = scratch.patch_text(commit)
        patch = parse_patch(name, text)
        header_fields(patch)  # refuse a commit whose message lacks the header fields
        (patches_dir / name).write_text(text)
        names.append(name)
        print(f"  {name}: {sum(len(f.hunks) for f in patch.files)} hunks")
    for stale in sorted(old - set(names)):
        (patches_dir / stale).unlink(missing_ok=True)
        print(f"  {stale}: removed (no longer in the scratch tree)")
    (patches_dir / "series").write_text("\n".join(names) + "\n")
    print(f"refresh: wrote {len(names)} patches and patches/series")
    return 0


def _new_upstream_files(
    version: str, paths: set[str], upstream_tree: Optional[Path], name: str
) -> tuple[dict[str, bytes], list]:
    if upstream_tree is not None:
        root = upstream_tree
        if not (root / name).is_dir() and (root / "python" / name).is_dir():
            root = root / "python"
        files = {p: (root / p).read_bytes() for p in paths if (root / p).is_file()}
        print(f"  new upstream: local tree {root} (as {name} {version})")
        return files, []
    wheels = index_wheels(name, version)
    tag = interpreter_tag()
    chosen = next((w for w in wheels if w.tag == tag), None)
    if chosen is None:
        raise PinError(f"{name} {version} has no wheel for {tag} on the index")
    wheel = fetch_wheel(chosen, log=lambda m: print(f"  {m}"))
    return _wheel_files(wheel, paths), wheels


def cmd_rebase(
    repo: Path, version: str, upstream_tree: Optional[Path], dry_run: bool, work: Optional[Path]
) -> int:
    pin = read_pin(repo / "UPSTREAM.toml")
    patches = load_series(repo / "patches")
    print(f"rebase: {len(patches)} patches from {pin.name} {pin.version} to {version}")
    touched = {fp.old_path for p in patches for fp in p.files if fp.old_path}
    old_files = _wheel_files(_pinned_wheel(pin), touched)
    new_files, new_wheels = _new_upstream_files(version, touched, upstream_tree, pin.name)

    with tempfile.TemporaryDirectory(prefix="glm5mega-rebase-") as tmp:
        scratch = Scratch.create(
            work or Path(tmp) / "tree", old_files, f"upstream {pin.name} {pin.version}"
        )
        commits = []
        for patch in patches:
            changed: dict = {}
            apply_patch(patch, scratch.read, changed)
            commits.append(scratch.commit_patch(patch, changed))
        scratch.git("checkout", "-q", "-b", "rebased", "upstream")
        gone = sorted(touched - set(new_files))
        scratch.write({p: None for p in gone})
        scratch.write(new_files)
        scratch.commit(f"upstream {pin.name} {version}")
        conflicts: dict[str, list[str]] = {}
        for patch, commit in zip(patches, commits):
            direct: dict = {}
            try:
                apply_patch(patch, scratch.read, direct)
                how = "applies as is"
            except PatchError:
                how = "merged 3-way"
            picked = scratch.git(
                "cherry-pick", "--allow-empty", "--keep-redundant-commits", commit, check=False
            )
            if picked.returncode == 0:
                if scratch.git("diff", "--quiet", "HEAD^", "HEAD", check=False).returncode:
                    print(f"  {patch.name}: ok ({how})")
                else:
                    conflicts[patch.name] = ["(upstream already has it: drop the patch)"]
                    print(f"  {patch.name}: EMPTY, upstream already has this change")
                continue
            files = scratch.git("diff", "--name-only", "--diff-filter=U").stdout.split()
            files += [p for p in gone if p in {fp.old_path for fp in patch.files}]
            conflicts[patch.name] = sorted(set(files)) or ["(no file named by git)"]
            scratch.git("cherry-pick", "--abort", check=False)
            print(f"  {patch.name}: CONFLICT in {', '.join(conflicts[patch.name])}")
        if conflicts:
            print(f"rebase: {len(conflicts)} of {len(patches)} patches conflict; nothing "
                  "written. Resolve them in a scratch tree (check --scratch), then refresh.")
            return 1
        if dry_run:
            print("rebase: every patch carries over (dry run: nothing written)")
            return 0
        for commit in scratch.patch_commits(base="HEAD~%d" % len(patches)):
            name, text = scratch.patch_text(commit)
            (repo / "patches" / name).write_text(text)
    if not new_wheels:
        try:
            new_wheels = index_wheels(pin.name, version)
        except PinError as exc:
            print(f"  warning: {exc}; the pin keeps no wheels and the build will refuse "
                  "until they are pinned")
    (repo / "UPSTREAM.toml").write_text(
        render_pin(Pin(name=pin.name, version=version, local="glm5mega.1", wheels=new_wheels))
    )
    print(f"rebase: patches and UPSTREAM.toml now target {pin.name} {version}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="patchtool", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_check = sub.add_parser("check", help="apply the series to the pinned upstream")
    p_check.add_argument("--scratch", type=Path, help="also leave a git scratch tree here")
    p_refresh = sub.add_parser("refresh", help="rewrite patches/ from a scratch tree")
    p_refresh.add_argument("--scratch", type=Path, required=True)
    p_rebase = sub.add_parser("rebase", help="carry the series onto another upstream release")
    p_rebase.add_argument("--to", required=True, metavar="VERSION")
    p_rebase.add_argument("--upstream-tree", type=Path, help="a local upstream python/ tree")
    p_rebase.add_argument("--dry-run", action="store_true", help="report only")
    p_rebase.add_argument("--work", type=Path, help="keep the rebase's git tree here")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "check":
            return cmd_check(args.repo, args.scratch)
        if args.cmd == "refresh":
            return cmd_refresh(args.repo, args.scratch)
        return cmd_rebase(args.repo, args.to, args.upstream_tree, args.dry_run, args.work)
    except (PinError, PatchError) as exc:
        print(f"{args.cmd}: FAILED {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
