#!/usr/bin/env python3
"""`make mutation`: how many mutants of the operator's pure modules the unit tests kill (a measurement).

mutmut (pinned in operator/pyproject.toml's dev extras) copies the package into `mutants/`, rewrites
each function into a trampoline that runs the original or one mutant, and runs, for each mutant, only
the unit tests that called that function (it records which in a first, clean run).

The repository does not have the layout mutmut expects (the package under `operator/src`, the tests
at the top), so it runs in a workspace, `.local/mutation/`, whose `src`, `tests` and the files the
unit tests read are links into the repository. mutmut copies them into `.local/mutation/mutants/`,
puts `mutants/src` first on `sys.path` and removes the path the editable install added
(`operator/src`, which is what the `src` link resolves to): the tests import the mutated copy. Two
checks prove it on every run: mutmut's own "forced fail" run (every trampoline raises: the tests
must fail), and the stats run, which stops when no test reached a trampoline.

Each module gets two figures: the mutants the unit tests kill, and those they kill without the
golden-file tests (the `golden` marker, tests/fixtures/golden.py), which pin whole manifests and
sentences and so kill much that no test of a meaning does. mutmut runs twice: first with
`-m "not golden"` on every mutant, then with every unit test on that run's survivors only (a mutant
killed without the golden tests is killed with them), after a fresh stats run that records which
golden tests reach which function.

Survivors that no test can kill (the mutant behaves like the original) are listed, with why, in
hack/mutation-equivalent.txt, each by its content, not its number: mutmut numbers a function's
mutants in order, so an edit above a mutation renumbers it, and a listed number would then excuse
whichever mutant took it. An entry is the function and a hash of the mutant's diff (`mutmut show`'s,
without its file and line-number headers: the changed line and the three on each side), so a survivor
is excused only while that very change, in that very place, survives. Any other survivor is printed
with its key (`mutmut show NAME` in the workspace prints its diff), and a listed key that is no
longer a survivor (killed, or its code changed) is printed too; either makes the run exit 1.
A whole run makes some 6,000 mutants (2 h 23 min on 2 shared cores beside other jobs, 2026-11-30),
so `--module` measures one module at a time; each module's last result is kept in
.local/mutation.json and the table shows every module measured so far.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "src" / "tfdata_operator"
# The pure modules (spec in, manifests and decisions out, no I/O), by the name `--module` takes:
# their paths under the package ("builders": every module of render/, one per child kind and the
# parts they share, which render/builders.py gathers; "spec": every module of the api/spec package).
MODULES = {
    "spec": tuple(
        f"api/spec/{p.stem}" for p in sorted((PACKAGE / "api" / "spec").glob("*.py")) if p.stem != "__init__"
    ),
    "diff": ("api/diff",),
    "builders": tuple(f"render/{p.stem}" for p in sorted((PACKAGE / "render").glob("*.py")) if p.stem != "__init__"),
    "scaling": ("plan/scaling",),
    "status": ("plan/status",),
    "plan": ("plan/desired",),
    "serverconfig": ("wire/serverconfig",),
}
# A mutant's name is the module's dotted path, then the function: module name -> those prefixes.
PREFIXES = {
    m: tuple("tfdata_operator." + path.replace("/", ".") + "." for path in paths) for m, paths in MODULES.items()
}
WORKSPACE = ROOT / ".local" / "mutation"
EQUIVALENT = ROOT / "hack" / "mutation-equivalent.txt"
# module -> mutant name -> mutmut's status ("killed", "survived", ...)
Statuses = dict[str, dict[str, str]]
# mutant name -> its content key (`key`), for the survivors
Keys = dict[str, str]
# Each module's last result (a run of some modules keeps the others'): outside the workspace,
# which every run starts afresh.
RESULT = ROOT / ".local" / "mutation.json"
# What the unit tests read besides themselves (cases.ROOT is the workspace's copy, `mutants/`).
LINKED = (
    "tests", "crds", "examples", "hack", "charts", "docs", "README.md", "devcluster", "benchmarks", "kind", "images",
    "pytest.ini", "Makefile", ".github", ".ci", "operator",
)  # fmt: skip
KILLED = ("killed", "timeout")
# The first run's test selection leaves the golden-file tests out (tests/fixtures/golden.py).
WITHOUT_GOLDEN = ("-m", "not golden")


def function_of(name: str) -> str:
    """The mutated function's dotted name: the mutant's name without mutmut's `__mutmut_<n>`."""
    return re.sub(r"__mutmut_\d+$", "", name)


def key(name: str, diff: str) -> str:
    """``name``'s content key: its function, `@`, and 12 hex digits of the SHA-256 of ``diff``
    (`mutmut show`'s unified diff of the function) without its two file headers and its `@@` hunk
    headers, whose line numbers move with any edit above the mutation."""
    body = [line for line in diff.splitlines()[2:] if not line.startswith("@@")]
    if not any(line.startswith(("-", "+")) for line in body):
        raise ValueError(f"{name}: its diff changes no line:\n{diff}")
    digest = hashlib.sha256("\n".join(body).encode()).hexdigest()
    return f"{function_of(name)}@{digest[:12]}"


def read_equivalent(text: str) -> dict[str, str]:
    """content key -> why it is equivalent; one `key  why` a line, `#` comments."""
    listed: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        entry, _, why = line.partition(" ")
        where = f"{EQUIVALENT.relative_to(ROOT)}:{number}"
        if not re.fullmatch(r"tfdata_operator\.[\wǁ.]+@[0-9a-f]{12}", entry):
            sys.exit(f"{where}: {entry!r} is not a content key (function@12 hex digits; the run prints them)")
        if not why.strip():
            sys.exit(f"{where}: {entry} has no reason; write why it is equivalent")
        if entry in listed:
            sys.exit(f"{where}: {entry} is listed twice")
        listed[entry] = why.strip()
    return listed


def prepare(modules: list[str]) -> None:
    """A fresh workspace: mutmut's config (without the golden tests), and links to what it copies."""
    shutil.rmtree(WORKSPACE, ignore_errors=True)
    WORKSPACE.mkdir(parents=True)
    (WORKSPACE / "src").symlink_to(PACKAGE.parent)
    for name in LINKED:
        (WORKSPACE / name).symlink_to(ROOT / name)
    write_config(modules, WITHOUT_GOLDEN)


def write_config(modules: list[str], selection: tuple[str, ...]) -> None:
    """mutmut's setup.cfg: the unit tier, narrowed by ``selection`` (pytest arguments)."""
    only = "\n    ".join(f"src/tfdata_operator/{path}.py" for m in modules for path in MODULES[m])
    also = "\n    ".join(n for n in LINKED if n != "tests")
    select = "".join(f"\n    {arg}" for arg in ("tests/unit", *selection))
    (WORKSPACE / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = src/tfdata_operator\n"
        f"only_mutate =\n    {only}\n"
        f"also_copy =\n    {also}\n"
        f"pytest_add_cli_args_test_selection ={select}\n"
        # Two modules check files, not the pure modules, in subprocesses that would import the
        # installed, unmutated package: the test plumbing, and the CRD's generated schemas.
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    --ignore=tests/unit/project/test_test_plumbing.py\n"
        "    --ignore=tests/unit/project/test_crd_schemas.py\n"
        # One test runs the package's copy that `inject` makes on a Python without site-packages
        # (-S: an image without TensorFlow); in mutants/ that copy is the mutated one, whose
        # trampolines import mutmut, which such a Python cannot: it fails whatever the mutant.
        "    --deselect=tests/unit/server/test_inject.py::"
        "test_bootstrap_on_a_python_without_tensorflow_exits_3_with_one_line\n"
        # Forked from a server process that ran no test: children forked from the process that
        # ran the whole suite inherit its threads' locks (the work queue's), and hang.
        "process_isolation = forkserver\n"
    )


def run_mutmut(max_children: int, names: list[str] | None = None) -> None:
    """``mutmut run``: every mutant not yet tested, or only ``names`` (tested again)."""
    mutmut = Path(sys.executable).parent / "mutmut"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # mutmut would pick the CI skip policy up from the environment; a mutant's failing test is the point.
    env.pop("CI", None)
    command = [str(mutmut), "run", "--max-children", str(max_children), *(names or [])]
    done = subprocess.run(command, cwd=WORKSPACE, env=env)
    if done.returncode != 0:
        sys.exit(f"mutmut run failed (exit {done.returncode}); its output is above")


def collect(modules: list[str]) -> Statuses:
    """module -> mutant name -> status, from the .meta files mutmut writes next to each mutated file."""
    sys.path.insert(0, str(WORKSPACE))  # nothing of the package: only mutmut's own table
    from mutmut.stats import status_by_exit_code

    result: dict[str, dict[str, str]] = {}
    for module in modules:
        result[module] = {}
        for path in MODULES[module]:
            meta = WORKSPACE / "mutants" / "src" / "tfdata_operator" / f"{path}.py.meta"
            if not meta.exists():
                continue  # a file with nothing to mutate (only names, or only imports)
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            result[module].update({name: status_by_exit_code[code] for name, code in codes.items()})
    return result


def survivor_keys(statuses: Statuses) -> Keys:
    """The content key of every mutant in ``statuses`` that no test killed, from its diff in the workspace."""
    sys.path.insert(0, str(WORKSPACE))
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    paths = {prefix: path for m in MODULES for prefix, path in zip(PREFIXES[m], MODULES[m], strict=True)}
    keys: Keys = {}
    here = Path.cwd()
    os.chdir(WORKSPACE)  # mutmut reads mutants/<path> relative to its workspace
    try:
        for by_name in statuses.values():
            for name in sorted(n for n, s in by_name.items() if s not in KILLED):
                prefix = max((p for p in paths if name.startswith(p)), key=len)
                diff = get_diff_for_mutant(name, path=f"src/tfdata_operator/{paths[prefix]}.py")
                keys[name] = key(name, diff)
    finally:
        os.chdir(here)
    return keys


def measure(modules: list[str], max_children: int) -> tuple[Statuses, Statuses]:
    """(statuses with every unit test, statuses without the golden-file tests) of each module's mutants."""
    prepare(modules)
    run_mutmut(max_children)
    without = collect(modules)
    survivors = {n for by_name in without.values() for n, s in by_name.items() if s not in KILLED}
    measured = {m: dict(by_name) for m, by_name in without.items()}
    if survivors:
        print(f"\n{len(survivors)} mutants survived the unit tests without the golden files; again, with them:")
        again = with_golden(modules, max_children, survivors)
        for module, by_name in measured.items():
            by_name.update({n: again[module][n] for n in by_name if n in survivors})
    return measured, without


def with_golden(modules: list[str], max_children: int, names: set[str]) -> Statuses:
    """``names`` tested again with every unit test, the golden-file tests too (after a run without them)."""
    write_config(modules, ())
    # A fresh stats run: the last one never ran the golden tests, so no mutant would get them.
    (WORKSPACE / "mutants" / "mutmut-stats.json").unlink()
    run_mutmut(max_children, sorted(names))
    return collect(modules)


def recheck(modules: list[str], max_children: int) -> tuple[Statuses, Statuses]:
    """The last result's survivors of ``modules``, tested again with the unit tests as they are now: what a
    new test kills, in minutes rather than hours. Every other mutant keeps its measured status, which holds
    while the module's code is the code measured (its mutants, and so their names, are the same then; this
    refuses a module whose code changed) and no test was weakened since (a whole run measures that)."""
    if not RESULT.exists():
        sys.exit(f"--recheck needs a measured result ({RESULT.relative_to(ROOT)}): run without it first")
    kept = json.loads(RESULT.read_text())
    for module in modules:
        measured = kept.get("commits", {}).get(module, "").removesuffix("+changes")
        paths = [f"operator/src/tfdata_operator/{path}.py" for path in MODULES[module]]
        if not measured or subprocess.run(["git", "diff", "--quiet", measured, "--", *paths], cwd=ROOT).returncode:
            sys.exit(f"{module}: its code changed since it was measured ({measured or 'never'}): measure it again")
    statuses = {m: dict(kept["statuses"][m]) for m in modules}
    without = {m: dict(kept["statuses_without_golden"][m]) for m in modules}
    survivors = sorted(n for by_name in statuses.values() for n, s in by_name.items() if s not in KILLED)
    print(f"{len(survivors)} survivors of {', '.join(modules)}, tested again with the unit tests as they are now")
    if not survivors:
        return statuses, without
    prepare(modules)
    run_mutmut(max_children, survivors)
    bare = collect(modules)
    for module in modules:
        without[module].update({n: bare[module][n] for n in without[module] if n in survivors})
    left = {n for n in survivors if not any(bare[m].get(n) in KILLED for m in modules)}
    again = with_golden(modules, max_children, left) if left else bare
    for module in modules:
        statuses[module].update({n: again[module][n] for n in statuses[module] if n in survivors})
    return statuses, without


def kills(by_name: dict[str, str]) -> int:
    return sum(1 for s in by_name.values() if s in KILLED)


def share(killed: int | None, count: int) -> str:
    return "-" if killed is None else f"{100 * killed / count if count else 0.0:.1f}%"


def commit() -> str:
    """The commit measured, `+changes` when the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "operator", "tests"], cwd=ROOT, capture_output=True)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def report(measured: tuple[Statuses, Statuses, Keys] | None, equivalent: dict[str, str]) -> int:
    """Print and keep each module's figures; ``measured`` replaces those modules' kept results."""
    kept = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    now = commit()
    statuses: Statuses = {**kept.get("statuses", {}), **(measured[0] if measured else {})}
    # Results kept from before the figure without the golden tests existed have none.
    without: Statuses = {**kept.get("statuses_without_golden", {}), **(measured[1] if measured else {})}
    keys: Keys = {**kept.get("keys", {}), **(measured[2] if measured else {})}
    measured_at = {**kept.get("commits", {}), **dict.fromkeys(measured[0] if measured else (), now)}
    statuses = {m: statuses[m] for m in MODULES if m in statuses}
    without = {m: without[m] for m in statuses if m in without}
    rows: list[tuple[str, int, int | None, int, int]] = []
    unexplained: list[tuple[str, str]] = []  # (name, status)
    for module, by_name in statuses.items():
        survivors = sorted(n for n, s in by_name.items() if s not in KILLED)
        if any(n not in keys for n in survivors):
            sys.exit(f"{RESULT.relative_to(ROOT)} has no content keys for {module}'s survivors: measure it again")
        listed = sum(1 for n in survivors if keys[n] in equivalent)
        unexplained += [(n, by_name[n]) for n in survivors if keys[n] not in equivalent]
        bare = kills(without[module]) if module in without else None
        rows.append((module, kills(by_name), bare, listed, len(by_name)))
    whole = None if any(r[2] is None for r in rows) else sum(r[2] or 0 for r in rows)
    rows.append(("overall", sum(r[1] for r in rows), whole, sum(r[3] for r in rows), sum(r[4] for r in rows)))
    print("\nkilled: by the unit tests; w/o golden: by them without the golden-file tests")
    print(
        f"{'module':<14}{'killed':>8}{'w/o golden':>12}{'total':>8}{'killed %':>10}{'w/o golden %':>14}"
        f"{'equivalent':>12}{'left':>6}  commit"
    )
    for module, killed, bare, listed, count in rows:
        print(
            f"{module:<14}{killed:>8}{'-' if bare is None else bare:>12}{count:>8}{share(killed, count):>10}"
            f"{share(bare, count):>14}{listed:>12}{count - killed - listed:>6}  {measured_at.get(module, '')}"
        )
    # A listed key of a measured module that no survivor has: its mutant is killed now, or its code
    # (the mutated line or the three on each side) changed, and whether it is equivalent is a new question.
    surviving = {keys[n] for by_name in statuses.values() for n, s in by_name.items() if s not in KILLED}
    prefixes = tuple(p for m in statuses for p in PREFIXES[m])
    stale = sorted(k for k in equivalent if k.startswith(prefixes) and k not in surviving)
    for entry in stale:
        print(f"listed as equivalent but no survivor has this content now (killed, or its code changed): {entry}")
    if unexplained:
        print("\nsurvivors neither killed nor listed as equivalent (`cd .local/mutation && mutmut show NAME`):")
        print("\n".join(f"  {keys[n]}  {n}: {s}" for n, s in unexplained))
    out = {
        "modules": {
            m: {"killed": k, "killed_without_golden": b, "equivalent": e, "total": t, "commit": measured_at.get(m)}
            for m, k, b, e, t in rows
        },
        "survivors": [f"{keys[n]} {n}" for n, _ in unexplained],
        "statuses": statuses,
        "statuses_without_golden": without,
        "keys": keys,
        "commits": measured_at,
    }
    RESULT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"\nmeasured now: {', '.join(measured[0]) if measured else 'nothing'}; result: {RESULT.relative_to(ROOT)}")
    return 1 if unexplained or stale else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", choices=MODULES, help="only these (default: all)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--report-only", action="store_true", help="print the table of the last results again")
    parser.add_argument(
        "--recheck", action="store_true", help="test only the last result's survivors again (the code unchanged)"
    )
    args = parser.parse_args()
    modules = args.module or list(MODULES)
    equivalent = read_equivalent(EQUIVALENT.read_text())
    if args.report_only:
        sys.exit(report(None, equivalent))
    measuring = recheck if args.recheck else measure
    statuses, without = measuring(modules, args.max_children)
    sys.exit(report((statuses, without, survivor_keys(statuses)), equivalent))


if __name__ == "__main__":
    main()
