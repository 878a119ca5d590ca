#!/usr/bin/env python3
"""Every commit that changes a golden file says why, in a line `Golden: <reason>` (run by `make lint`).

The files in tests/unit/golden/ are reviewed expectations: a change to one is a change of what
users see (a manifest, a refusal's sentence), so its commit carries a one-line reason.

Which commits: those after the one that added this script (the rule starts there), up to HEAD,
or with `--base REV` those since REV (a pull request's base). A shallow clone's history ends at
its boundary, whose commit git shows as adding every file: the commits after it are checked, and
the run says so (`git fetch --unshallow` checks all).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = "tests/unit/golden/"
THIS = "hack/check-golden-commits.py"
# `Golden: <reason>` on a line of its own; a reason of a few words at least.
REASON = re.compile(r"^Golden:[ \t]*(\S.{8,})$", re.M)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def rule_start(repo: Path) -> str | None:
    """The oldest commit in reach that added this script (a shallow clone's boundary, at worst)."""
    added = git(repo, "log", "--format=%H", "--diff-filter=A", "--", THIS).split()
    return added[-1] if added else None


def offenders(repo: Path, since: str) -> tuple[int, list[str]]:
    """(commits checked, one line for each one that changes a golden file without a reason)."""
    log = git(repo, "log", "--full-history", "--no-merges", "--format=%H%x00%B%x01", f"{since}..HEAD", "--", GOLDEN_DIR)
    checked, bad = 0, []
    for entry in filter(str.strip, log.split("\x01")):
        sha, _, message = entry.strip().partition("\x00")
        checked += 1
        if REASON.search(message):
            continue
        listed = git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", sha, "--", GOLDEN_DIR).split()
        changed = [f.removeprefix(GOLDEN_DIR) for f in listed]
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        subject = (message.strip().splitlines() or [""])[0]
        bad.append(f"{sha[:12]} ({subject[:60]}): {', '.join(changed[:3])}{more}")
    return checked, bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="check the commits since this one (default: since the rule began)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args()
    since = args.base or rule_start(args.repo)
    if since is None:
        print(f"check-golden-commits: {THIS} is not committed yet; the rule starts with the commit that adds it")
        return 0
    checked, bad = offenders(args.repo, since)
    shallow = git(args.repo, "rev-parse", "--is-shallow-repository").strip() == "true"
    note = " (a shallow clone: `git fetch --unshallow` checks from where the rule began)" if shallow else ""
    if bad:
        print(f"commits that change {GOLDEN_DIR} without a `Golden: <reason>` line in their message:", file=sys.stderr)
        print("\n".join(f"  {line}" for line in bad), file=sys.stderr)
        print(
            "Say in one line why the expectation changed (`Golden: the refusal names the field as written`), "
            "with `git commit --amend` or `git rebase -i` (reword).",
            file=sys.stderr,
        )
        return 1
    print(f"check-golden-commits: {checked} commit(s) since {since[:12]} change golden files, each says why{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
