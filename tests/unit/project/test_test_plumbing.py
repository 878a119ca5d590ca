"""The test suite's own plumbing: one fixtures layer, no silent skips, workflows that run.

These run pytest in a subprocess, on the repository's tiers (collection only) or on a tiny
test file written for the purpose, and read its exit code and output.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.cases import ROOT
from fixtures.tiers import TIERS

TESTS = ROOT / "tests"
TIER_PATHS = [
    "tests/unit",
    "tests/server",
    "tests/integration",
    "tests/e2e",
    "tests/hostile",
    "tests/nodeagent",
    "tests/images",
    "tests/kind",
]


def pytest_run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """pytest in a fresh process: plugins, conftests and sys.path as a user's command gets them."""
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "TFDATA_TEST_RESULTS", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def collected(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if "::" in line]


# --- One fixtures layer ------------------------------------------------------------------------


@pytest.mark.timeout(300)  # two collections that import TensorFlow, on a shared 2-core machine
def test_every_tier_collects_in_one_run_in_any_order_with_its_marker() -> None:
    forward = pytest_run("--collect-only", "-q", *TIER_PATHS)
    # Backwards, and deselecting two tiers by marker: the markers come from tests/fixtures/tiers.py.
    backward = pytest_run("--collect-only", "-q", "-m", "not (kind or nodeagent)", *reversed(TIER_PATHS))
    for run in (forward, backward):
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert not re.search(r"\berrors?\b", run.stdout.splitlines()[-1]), run.stdout[-3000:]
    tiers = {nodeid.split("/")[1] for nodeid in collected(forward)}
    assert tiers == {path.split("/")[1] for path in TIER_PATHS}, tiers
    deselected = set(collected(forward)) - set(collected(backward))
    assert set(collected(backward)) < set(collected(forward))
    assert {nodeid.split("/")[1] for nodeid in deselected} == {"kind", "nodeagent"}, deselected
    assert not any(nodeid.split("/")[1] in ("kind", "nodeagent") for nodeid in collected(backward))
    # Each tier's tests stay together, its longest modules first (Tier.longest_first), in that order.
    for run in (forward, backward):
        modules = list(dict.fromkeys(nodeid.split("::")[0] for nodeid in collected(run)))
        order = [m.split("/")[1] for m in modules]
        assert order == sorted(order, key=order.index), order  # contiguous: every tier a single run of modules
        for name, tier in TIERS.items():
            mine = [Path(m).name for m in modules if m.split("/")[1] == name]
            assert mine[: len(tier.longest_first)] == list(tier.longest_first), (name, mine)


def test_every_module_a_tier_runs_first_is_there() -> None:
    for name, tier in TIERS.items():
        missing = [m for m in tier.longest_first if not (ROOT / "tests" / name / m).is_file()]
        assert not missing, f"TIERS[{name!r}].longest_first names modules that are not in tests/{name}: {missing}"


def test_no_test_module_imports_a_conftest() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in TESTS.rglob("*.py")
        if path != Path(__file__)
        and re.search(r"^\s*(from conftest import|import conftest)|integration_conftest", path.read_text(), re.M)
    ]
    assert not offenders, f"import shared helpers from tests/fixtures instead: {offenders}"


def test_the_hostile_cases_run_alone_in_a_pod_on_the_standard_library() -> None:
    """tests/kind/test_kind_hostile.py runs tests/fixtures/hostile.py's text in a trainer's pod, where
    neither the tests' helpers nor any other package is there: every import outside a
    TYPE_CHECKING block must be of the standard library."""
    tree = ast.parse((TESTS / "fixtures" / "hostile.py").read_text())
    checked = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    imported = {
        (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
        for statement in checked
        for node in ast.walk(statement)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported, "no import found: the check reads the wrong file"
    assert not imported - set(sys.stdlib_module_names) - {"__future__"}, sorted(imported)


# --- No silent skips ---------------------------------------------------------------------------

TINY = """
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("needs a flux capacitor")
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A project of its own: one passing and one skipping test, an empty allowlist."""
    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "pytest.ini").write_text("[pytest]\nskip_allowlist = allow.txt\n")
    (tmp_path / "allow.txt").write_text("# nothing allowed\n")
    return tmp_path


def run_with_plugin(plugin: str, project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest on a project of its own with one plugin of the fixtures layer, as tests/conftest.py loads it."""
    pythonpath = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return pytest_run("-p", plugin, "-q", *args, str(project), cwd=project, env={"PYTHONPATH": pythonpath, **env})


def run_tiny(project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest on the tiny project with the fixtures layer's skip check."""
    return run_with_plugin("fixtures.skips", project, **env)


def test_a_skip_fails_the_run_under_ci(tiny: Path) -> None:
    run = run_tiny(tiny, CI="true")
    assert run.returncode == 1, run.stdout
    assert "1 passed, 1 skipped" in run.stdout, run.stdout
    assert "skips not in the allowlist" in run.stdout and "needs a flux capacitor" in run.stdout, run.stdout


def test_a_skip_passes_outside_ci(tiny: Path) -> None:
    run = run_tiny(tiny)
    assert run.returncode == 0, run.stdout
    assert "skips not in the allowlist" not in run.stdout


def test_an_allowlisted_skip_passes_under_ci(tiny: Path) -> None:
    (tiny / "allow.txt").write_text("flux capacitor :: the tiny test has none on purpose\n")
    run = run_tiny(tiny, CI="true")
    assert run.returncode == 0, run.stdout


def test_an_allowlist_entry_without_a_why_is_refused(tiny: Path) -> None:
    (tiny / "allow.txt").write_text("flux capacitor\n")
    run = run_tiny(tiny, CI="true")
    assert run.returncode != 0
    assert "allow.txt:1: write `<reason regex> :: <why it may skip>`" in run.stdout + run.stderr


# Three ways a whole module is skipped before any of its tests exists: each must reach the check.
COLLECTION_SKIPS = {
    "importorskip": (
        {"test_needs.py": 'import pytest\n\npytest.importorskip("flux_capacitor")\n\ndef test_a():\n    pass\n'},
        "could not import 'flux_capacitor'",
    ),
    "module-level-skip": (
        {"test_needs.py": 'import pytest\n\npytest.skip("no flux capacitor here", allow_module_level=True)\n'},
        "no flux capacitor here",
    ),
    "collector": (
        {
            "conftest.py": (
                "import pytest\n\n"
                "class Spec(pytest.File):\n"
                "    def collect(self):\n"
                '        pytest.skip("spec files need a flux capacitor")\n\n'
                "def pytest_collect_file(file_path, parent):\n"
                '    if file_path.suffix == ".spec":\n'
                "        return Spec.from_parent(parent, path=file_path)\n"
            ),
            "needs.spec": "anything\n",
        },
        "spec files need a flux capacitor",
    ),
}


@pytest.mark.parametrize("kind", COLLECTION_SKIPS)
def test_a_skip_at_collection_fails_the_run_under_ci_unless_allowed(tiny: Path, kind: str) -> None:
    files, reason = COLLECTION_SKIPS[kind]
    for name, text in files.items():
        (tiny / name).write_text(text)
    (tiny / "test_tiny.py").write_text("def test_runs():\n    pass\n")
    results = tiny / "results"
    run = run_tiny(tiny, CI="true", TFDATA_TEST_RESULTS=str(results))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed, 1 skipped" in run.stdout, run.stdout
    assert "skips not in the allowlist" in run.stdout and reason in run.stdout, run.stdout
    counts = json.loads((results / "other.json").read_text())
    assert {k: counts[k] for k in ("skipped", "skipped_not_allowed", "exitstatus")} == {
        "skipped": 1, "skipped_not_allowed": 1, "exitstatus": 1,
    }, counts  # fmt: skip

    (tiny / "allow.txt").write_text(f"{re.escape(reason)} :: the tiny project lacks it on purpose\n")
    allowed = run_tiny(tiny, CI="true", TFDATA_TEST_RESULTS=str(results))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "1 passed, 1 skipped" in allowed.stdout, allowed.stdout
    assert json.loads((results / "other.json").read_text())["skipped_not_allowed"] == 0


def test_the_ci_entry_point_and_every_workflow_job_apply_the_skip_rule() -> None:
    """The rule lives under CI=true: `.ci/run` must set it before `make`, and each workflow job
    must say so too (GitHub sets it, but a job's env is where a reader looks)."""
    ci_run = (ROOT / ".ci" / "run").read_text()
    export = re.search(r"^export CI=true$", ci_run, re.M)
    first_make = re.search(r"^\s*make\b", ci_run, re.M)
    assert export and first_make and export.start() < first_make.start(), ci_run
    for path in sorted((ROOT / ".github" / "workflows").glob("*.y*ml")):
        for name, job in yaml.safe_load(path.read_text())["jobs"].items():
            assert str(job.get("env", {}).get("CI")).lower() == "true", f"{path.name} job {name}: set env CI: true"


def test_the_repositorys_allowlist_parses_and_says_why() -> None:
    from fixtures.skips import read_allowlist

    entries = read_allowlist(TESTS / "skip-allowlist.txt")
    assert all(len(entry.why) > 20 for entry in entries), entries


def test_each_run_writes_its_counts_and_the_table_shows_them(tiny: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = run_tiny(tiny, CI="true", TFDATA_TEST_RESULTS=str(results))
    assert run.returncode == 1
    counts = json.loads((results / "other.json").read_text())
    assert 0 <= counts.pop("seconds") < 60, counts
    assert counts == {
        "passed": 1, "failed": 0, "errors": 0, "skipped": 1, "skipped_not_allowed": 1, "exitstatus": 1,
    }  # fmt: skip
    table = subprocess.run(
        [sys.executable, str(TESTS / "fixtures" / "results.py"), str(results)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert re.fullmatch(r"other\s+1\s+0\s+0\s+1 \(1 not allowed\)\s+0:\d\d\s+-\s+FAILED \(exit 1\)", table[-3]), table
    assert any(re.fullmatch(r"unit\s+-\s+-\s+-\s+-\s+-\s+\d+:\d\d\s+not run", line) for line in table), table
    assert re.fullmatch(r"steps, summed\s+0:\d\d", table[-2]), table
    assert re.fullmatch(r"make test\s+0:\d\d\s+\d+:\d\d", table[-1]), table


def test_each_failure_is_said_before_the_table(tiny: Path, tmp_path: Path) -> None:
    """CI's log keeps the tail: each failed test's message is printed there, cut to a bounded length."""
    (tiny / "test_tiny.py").write_text(
        TINY
        + "\ndef test_fails():\n    assert 1 == 2, 'the dispatcher said ' + 'x' * 5000\n"
        + "\n@pytest.fixture\ndef broken():\n    raise RuntimeError('no cluster')\n"
        + "\ndef test_errors(broken):\n    pass\n"
    )
    results = tmp_path / "results"
    run = run_tiny(tiny, TFDATA_TEST_RESULTS=str(results))
    assert run.returncode == 1, run.stdout
    said = json.loads((results / "other.json").read_text())["failures"]
    assert [line.split(": ", 1)[0] for line in said] == [
        "test_tiny.py::test_fails (call)",
        "test_tiny.py::test_errors (setup)",
    ], said
    assert "the dispatcher said xxx" in said[0] and len(said[0]) < 700 and said[0].endswith("…"), said[0]
    assert "RuntimeError: no cluster" in said[1], said[1]
    shown = subprocess.run(
        [sys.executable, str(TESTS / "fixtures" / "results.py"), str(results)], capture_output=True, text=True
    ).stdout.splitlines()
    start = shown.index("why each failed (the first lines of each; the tier's log has the rest):")
    assert shown[start + 1].startswith(
        "  other: test_tiny.py::test_fails (call): AssertionError: the dispatcher said"
    ), shown
    assert shown[start + 2].startswith("  other: test_tiny.py::test_errors (setup): RuntimeError: no cluster"), shown
    assert shown[start + 3].startswith("step "), shown


def test_a_step_over_its_budget_fails_make_test_and_says_which(tmp_path: Path) -> None:
    """`make test` exits with results.py's status: a step (or the whole) past tests/budgets.toml fails it."""
    results, budgets = tmp_path / "results", tmp_path / "budgets.toml"
    results.mkdir()
    (results / "unit.json").write_text(json.dumps({
        "passed": 3, "failed": 0, "errors": 0, "skipped": 0, "exitstatus": 0, "seconds": 125,
    }))  # fmt: skip
    (results / "lint.json").write_text(json.dumps({"seconds": 30, "exitstatus": 0, "step": True}))
    budgets.write_text("[steps]\nunit = 120\nlint = 60\n[total]\nseconds = 150\n")

    def run(*wall: str) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, str(TESTS / "fixtures" / "results.py"), str(results), "--budgets", str(budgets)]
        return subprocess.run([*args, *wall], capture_output=True, text=True, check=False)

    over = run()
    assert over.returncode == 1, over.stdout
    assert re.search(r"^unit\s+3\s+0\s+0\s+0\s+2:05\s+2:00\s+ok; OVER BUDGET by 0:05$", over.stdout, re.M), over.stdout
    assert re.search(r"^lint\s+0:30\s+1:00\s+ok$", over.stdout, re.M), over.stdout
    assert "make test: unit took 2:05, over its budget of 2:00" in over.stdout
    assert "make test: make test took 2:35, over its budget of 2:30" in over.stdout
    budgets.write_text("[steps]\nunit = 130\nlint = 60\n[total]\nseconds = 200\n")
    within = run()
    assert within.returncode == 0 and "OVER" not in within.stdout, within.stdout
    # Lanes side by side: the whole is the wall time, which the total's budget holds.
    assert run("--wall", "190").returncode == 0
    late = run("--wall", "201")
    assert late.returncode == 1 and "make test took 3:21, over its budget of 3:20" in late.stdout, late.stdout


def test_a_slow_machine_scales_the_steps_budgets_by_its_own_measure_within_a_bound(tmp_path: Path) -> None:
    """The unit tier's time against a quiet day's says how slow this run's machine was: the other steps'
    budgets are scaled by it (at most ``max_factor``), its own and the whole's are not."""
    results, budgets = tmp_path / "results", tmp_path / "budgets.toml"
    results.mkdir()

    def tier(name: str, seconds: int) -> None:
        counts = {"passed": 1, "failed": 0, "errors": 0, "skipped": 0, "exitstatus": 0, "seconds": seconds}
        (results / f"{name}.json").write_text(json.dumps(counts))

    budgets.write_text(
        '[steps]\nunit = 200\nserver = 100\n[machine]\nstep = "unit"\nquiet_seconds = 100\nmax_factor = 1.6\n'
        "[total]\nseconds = 1000\n"
    )

    def run() -> subprocess.CompletedProcess[str]:
        args = [sys.executable, str(TESTS / "fixtures" / "results.py"), str(results), "--budgets", str(budgets)]
        return subprocess.run(args, capture_output=True, text=True, check=False)

    tier("unit", 150), tier("server", 140)  # a machine 1.5 times slower: 140 s is within 150
    slow = run()
    assert slow.returncode == 0, slow.stdout
    assert "machine: unit took 2:30, 1:40 on a quiet day: the other steps' budgets are x1.50" in slow.stdout
    assert re.search(r"^server\s+1\s+0\s+0\s+0\s+2:20\s+2:30\s+ok$", slow.stdout, re.M), slow.stdout
    tier("server", 160)  # grown past what the slow machine explains
    assert run().returncode == 1
    tier("unit", 190), tier("server", 160)  # 1.9 times slower, but no more than 1.6 is allowed for
    capped = run()
    assert capped.returncode == 0 and "x1.60 (at most x1.60)" in capped.stdout, capped.stdout
    tier("server", 161)
    assert run().returncode == 1
    tier("unit", 60), tier("server", 101)  # a fast machine does not tighten anything, nor loosen
    fast = run()
    assert fast.returncode == 1 and "server took 1:41, over its budget of 1:40" in fast.stdout, fast.stdout
    tier("unit", 210), tier("server", 10)  # the measure itself keeps its budget
    assert "unit took 3:30, over its budget of 3:20" in run().stdout


def test_every_step_of_make_test_has_a_budget() -> None:
    from fixtures.results import ORDER, tomllib
    from fixtures.tiers import TIERS

    budgets = tomllib.loads((TESTS / "budgets.toml").read_text())
    assert set(TIERS) <= set(ORDER), set(TIERS) - set(ORDER)
    assert set(budgets["steps"]) == set(ORDER), set(budgets["steps"]) ^ set(ORDER)
    assert sum(budgets["steps"].values()) >= budgets["total"]["seconds"] > 0
    makefile = (ROOT / "Makefile").read_text()
    for step in ORDER:
        assert step in TIERS or f"$(TIMED) {step} " in makefile, f"the Makefile does not time the step {step}"


# --- Golden files: reviewed, never rewritten silently ---------------------------------------------

GOLDEN_TEST = """
def test_says(golden):
    golden("says.txt", "hello\\n")

def test_plain():
    pass
"""


@pytest.fixture
def golden_project(tmp_path: Path) -> Path:
    """A project of its own whose one golden test expects golden/says.txt, which says something else."""
    (tmp_path / "test_says.py").write_text(GOLDEN_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_dir = golden\n")
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "says.txt").write_text("goodbye\n")
    return tmp_path


def run_golden(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_with_plugin("fixtures.golden", project, *args, **env)


def test_a_changed_golden_file_fails_saying_so(golden_project: Path) -> None:
    run = run_golden(golden_project)
    assert run.returncode == 1, run.stdout
    assert "golden/says.txt changed" in run.stdout and "+hello" in run.stdout, run.stdout
    assert (golden_project / "golden" / "says.txt").read_text() == "goodbye\n"


def test_a_rewrite_fails_the_run_that_made_it_and_the_next_run_passes(golden_project: Path) -> None:
    rewrite = run_golden(golden_project, TFDATA_UPDATE_GOLDEN="1")
    assert rewrite.returncode == 1, rewrite.stdout
    assert "rewrote golden/says.txt: review the diff and commit it" in rewrite.stdout, rewrite.stdout
    assert "1 failed, 1 passed" in rewrite.stdout, rewrite.stdout
    assert (golden_project / "golden" / "says.txt").read_text() == "hello\n"
    # Nothing left to rewrite: the same command passes, and so does the check.
    assert run_golden(golden_project, TFDATA_UPDATE_GOLDEN="1").returncode == 0
    assert run_golden(golden_project).returncode == 0


def test_ci_refuses_to_rewrite_a_golden_file(golden_project: Path) -> None:
    (golden_project / "golden" / "says.txt").write_text("hello\n")  # even one that would not change
    run = run_golden(golden_project, TFDATA_UPDATE_GOLDEN="1", CI="true")
    assert run.returncode == 1, run.stdout
    assert "TFDATA_UPDATE_GOLDEN=1 under CI=true: golden files are not rewritten in CI" in run.stdout, run.stdout
    (golden_project / "golden" / "says.txt").write_text("goodbye\n")
    assert run_golden(golden_project, TFDATA_UPDATE_GOLDEN="1", CI="true").returncode == 1
    assert (golden_project / "golden" / "says.txt").read_text() == "goodbye\n"


def test_the_golden_marker_selects_exactly_the_tests_that_take_the_fixture(golden_project: Path) -> None:
    golden = run_golden(golden_project, "--collect-only", "-m", "golden")
    others = run_golden(golden_project, "--collect-only", "-m", "not golden")
    assert collected(golden) == ["test_says.py::test_says"], golden.stdout
    assert collected(others) == ["test_says.py::test_plain"], others.stdout


def test_make_golden_selects_every_golden_check_of_the_unit_tier() -> None:
    """Each of the repository's golden files is some `golden`-marked test's expectation: the files
    that the unit tier's golden tests name are those in tests/unit/golden/, no fewer, no more."""
    recipe = re.search(r"^golden:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and "TFDATA_UPDATE_GOLDEN=1 $(PYTEST) -q -m golden tests/unit" in recipe.group(1), recipe
    names = set()
    for path in (TESTS / "unit").rglob("test_*.py"):
        names |= set(re.findall(r"\bgolden\(\s*f?\"([^\"]+)\"", path.read_text()))
    patterns = [re.compile(re.sub(r"\\\{[^}]*\\\}", ".+", re.escape(name)) + "$") for name in names]
    files = [p.name for p in (TESTS / "unit" / "golden").iterdir()]
    unchecked = [f for f in files if not any(p.match(f) for p in patterns)]
    assert len(names) >= 5 and not unchecked, (sorted(names), unchecked)


GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"} | {
    f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER") for what, value in (("NAME", "t"), ("EMAIL", "t@t"))
}


def commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message], check=True, env=env)


def check_golden_commits(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = ROOT / "hack" / "check-golden-commits.py"
    run = [sys.executable, str(script), "--repo", str(repo), *args]
    return subprocess.run(run, capture_output=True, text=True, timeout=60, env={**os.environ, **GIT_ENV})


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """A repository whose golden file changed once before the rule and once after it, with a reason."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env={**os.environ, **GIT_ENV})
    commit(repo, {"tests/unit/golden/says.txt": "hello\n"}, "golden files, before the rule")
    commit(repo, {"hack/check-golden-commits.py": "# the rule\n"}, "the rule")
    commit(repo, {"tests/unit/golden/says.txt": "hi\n"}, "refusal: shorter\n\nGolden: the greeting is shorter now")
    commit(repo, {"README.md": "readme\n"}, "no golden file")
    return repo


def test_each_commit_that_changes_a_golden_file_says_why(history: Path) -> None:
    ok = check_golden_commits(history)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 commit(s) since" in ok.stdout, ok.stdout
    commit(history, {"tests/unit/golden/says.txt": "hey\n"}, "refusal: says hey\n\nGolden:")
    bad = check_golden_commits(history)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "(refusal: says hey): says.txt" in bad.stderr and "Golden: <reason>" in bad.stderr, bad.stderr
    # From an earlier base, the commit before the rule is checked too.
    first = subprocess.run(["git", "-C", str(history), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    subprocess.run(["git", "-C", str(history), "reset", "-q", "--hard", "HEAD~1"], check=True)
    assert check_golden_commits(history, "--base", first).returncode == 0
    commit(history, {"tests/unit/golden/other.txt": "new\n"}, "a new golden file without a reason")
    assert "other.txt" in check_golden_commits(history, "--base", first).stderr


def test_a_shallow_clone_checks_the_commits_it_has(history: Path, tmp_path: Path) -> None:
    commit(history, {"tests/unit/golden/says.txt": "hey\n"}, "no reason given")
    commit(history, {"README.md": "more\n"}, "after it")
    for depth, code in (("1", 0), ("2", 0), ("3", 1)):
        clone = tmp_path / f"depth-{depth}"
        subprocess.run(["git", "clone", "-q", "--depth", depth, f"file://{history}", str(clone)], check=True)
        run = check_golden_commits(clone)
        assert run.returncode == code, (depth, run.stdout, run.stderr)
        if code == 0:
            assert "shallow clone" in run.stdout, run.stdout


def test_make_lint_checks_the_golden_commits() -> None:
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and "hack/check-golden-commits.py" in recipe.group(1), recipe


# --- Workflows that work -----------------------------------------------------------------------


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:(?!=)", text, re.M))


def make_invocations(script: str) -> list[list[str]]:
    """The targets of every `make ...` command in a shell script (variables and flags dropped)."""
    found = []
    for line in script.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for match in re.finditer(r"(?:^|[;&|]\s*|\s)make\s+([^;&|#]*)", line):
            words = shlex.split(match.group(1))
            found.append([w for w in words if not w.startswith("-") and "=" not in w])
    return found


def workflow_scripts() -> dict[str, str]:
    scripts = {}
    for path in sorted((ROOT / ".github" / "workflows").glob("*.y*ml")):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            for i, step in enumerate(job.get("steps", [])):
                if "run" in step:
                    scripts[f"{path.name} step {i} ({step.get('name', '')})"] = step["run"]
    return scripts


def test_every_make_target_a_workflow_or_ci_names_exists() -> None:
    targets = make_targets()
    scripts = {**workflow_scripts(), ".ci/run": (ROOT / ".ci" / "run").read_text()}
    named = {(where, t) for where, script in scripts.items() for call in make_invocations(script) for t in call}
    assert named, "no make target found in the workflows"
    missing = sorted((where, t) for where, t in named if t not in targets)
    assert not missing, f"targets the Makefile lacks: {missing}"


def test_workflows_run_the_tests_through_make() -> None:
    """Like .ci/run: pytest through make targets, after `make venv` installs what they import."""
    scripts = workflow_scripts()
    direct = [where for where, script in scripts.items() if re.search(r"\bpytest\b|pip install", script)]
    assert not direct, f"steps that run pytest or install packages by hand instead of make targets: {direct}"
    calls = [t for script in scripts.values() for call in make_invocations(script) for t in call]
    assert "venv" in calls and calls.index("venv") < min(calls.index(t) for t in calls if t.startswith("test")), calls


def test_make_invocations_are_read_from_shell() -> None:
    assert make_invocations("start=1\nmake kind-up\nTFDATA=x make -k test-integration X=1 && make kind-down") == [
        ["kind-up"],
        ["test-integration"],
        ["kind-down"],
    ]


def test_a_unit_test_cannot_connect_past_loopback() -> None:
    import socket

    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock,
        pytest.raises(ConnectionRefusedError, match=r"10\.0\.0\.9"),
    ):
        sock.connect(("10.0.0.9", 8080))
