"""What the benchmarks say beside their figures (benchmarks/): the order in which each round runs its
variants, and how many runs each of bench_autoscaling's ratios of medians is over."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

from fixtures.cases import ROOT


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    """The benchmarks' modules, imported as `make bench-*` runs them (each imports the others by name)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return {name: importlib.import_module(name) for name in ("bench", "bench_autoscaling")}


def test_each_round_starts_with_the_next_variant(benchmarks: dict[str, ModuleType]) -> None:
    in_turn = benchmarks["bench"].in_turn
    assert [in_turn("AB", r) for r in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert [in_turn("ABC", r) for r in range(3)] == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"]]
    assert in_turn((), 1) == []


def test_autoscaling_rounds_alternate_the_first_mode_for_every_workload(benchmarks: dict[str, ModuleType]) -> None:
    bench = benchmarks["bench_autoscaling"]
    workloads = [bench.Workload("cpu-heavy", 10, 1, 0, 2), bench.Workload("io-bound", 10, 0, 40, 4)]
    order = [(run, w.key, mode, place) for run, w, mode, place in bench.schedule(3, workloads, ["TFData", "CPU"])]
    # Every round runs every workload under both modes, one after the other...
    assert [(r, w, place) for r, w, _, place in order] == [
        (r, w, place) for r in (1, 2, 3) for w in ("cpu-heavy", "io-bound") for place in (1, 2)
    ]
    # ...and starts with the other mode than the round before.
    first = [(r, w, m) for r, w, m, place in order if place == 1]
    assert first == [(1, "cpu-heavy", "TFData"), (1, "io-bound", "TFData"), (2, "cpu-heavy", "CPU"),
                     (2, "io-bound", "CPU"), (3, "cpu-heavy", "TFData"), (3, "io-bound", "TFData")]  # fmt: skip
    assert {(r, w, m) for r, w, m, _ in order} == {
        (r, w, m) for r in (1, 2, 3) for w in ("cpu-heavy", "io-bound") for m in ("TFData", "CPU")
    }


def run(mode: str, seconds: float | None, worker_seconds: float = 100.0) -> dict[str, Any]:
    figures = {"s to 2 ready workers": seconds, "worker-s while reading": worker_seconds, "replicas": "0:1"}
    return {"workload": "cpu-heavy", "mode": mode, "figures": figures}


def test_a_ratio_of_medians_says_how_many_runs_it_is_over_and_why_the_others_are_not(
    benchmarks: dict[str, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    bench = benchmarks["bench_autoscaling"]
    workload = bench.Workload("cpu-heavy", 10, 1, 0, 2)
    runs = [run("TFData", 10), run("TFData", 20), run("TFData", 30)]
    # CPU: two runs reached 2 workers, one never did, one failed: the ratio is of the two that did.
    runs += [run("CPU", 40, 90), run("CPU", None, 110), run("CPU", 50, 130)]
    runs.append({"workload": "cpu-heavy", "mode": "CPU", "error": "the trainer did not finish"})
    table = bench.summarize(runs, [workload], ["TFData", "CPU"])["CPU-heavy"]

    ratio = "CPU over TFData, s to 2 ready workers (medians)"
    assert table[ratio] == 2.25  # median(40, 50) / median(10, 20, 30): the keys and values of before
    assert table[f"{ratio}, n"] == "CPU 2 of 4 (never in 1, failed 1), TFData 3 of 3"
    assert table["TFData over CPU, worker-s while reading (medians), n"] == "TFData 3 of 3, CPU 3 of 4 (failed 1)"
    assert table["CPU"]["s to 2 ready workers"] == "45 (40-50), never in 1"

    args = type("Args", (), {"worker_cpu": "200m"})()
    bench.print_tables({"CPU-heavy": table}, [workload], ["TFData", "CPU"], args)
    printed = capsys.readouterr().out
    assert f"{ratio}: 2.25; n: CPU 2 of 4 (never in 1, failed 1), TFData 3 of 3\n" in printed
    assert f"{ratio}, n:" not in printed  # printed beside its ratio, not on a line of its own


def test_a_ratio_no_run_of_a_mode_has_says_so(benchmarks: dict[str, ModuleType]) -> None:
    bench = benchmarks["bench_autoscaling"]
    runs = [run("TFData", 50), run("TFData", 60), run("CPU", None), run("CPU", None)]
    table = bench.summarize(runs, [bench.Workload("cpu-heavy", 10, 1, 0, 2)], ["TFData", "CPU"])["CPU-heavy"]
    assert table["CPU over TFData, s to 2 ready workers (medians)"] == "-"
    assert table["CPU over TFData, s to 2 ready workers (medians), n"] == "CPU 0 of 2 (never in 2), TFData 2 of 2"
