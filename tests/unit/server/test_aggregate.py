"""The dispatcher's signal logic without TensorFlow: client table, journal reading, the reading decision, CPU."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tfdata_operator.server import metrics
from tfdata_operator.server.aggregate import Aggregator, ClientTable, JournalClients, WorkerReading
from tfdata_operator.server.journal import update_class
from tfdata_operator.wire import signals
from tfdata_operator.wire.serverconfig import DispatcherServerConfig

from fixtures.fakes import Clock


def report(client_id: str, stall: float = 0.2, done: bool = False) -> bytes:
    return signals.ClientReport(client_id, stall, 5.0, 10, done=done).to_json().encode()


def test_client_table_forgets_on_done_and_on_silence_and_is_bounded() -> None:
    clock = Clock(100.0)
    table = ClientTable(timeout_seconds=15, max_clients=2, clock=clock)
    assert table.receive(report("a")).status == 204
    assert table.receive(report("b")).status == 204
    full = table.receive(report("c"))
    assert full.status == 429 and b"max_tracked_clients" in full.body
    assert table.receive(report("a", done=True)).status == 204
    assert [c.client_id for c in table.live()] == ["b"]
    clock.now += 15.5
    assert table.live() == []
    bad = table.receive(b'{"client_id": "a"}')
    assert bad.status == 400 and b"missing fields" in bad.body
    assert (table.accepted, table.rejected) == (3, 2)


def test_service_signals_round_trip_and_refuse_what_the_operator_cannot_use() -> None:
    seen = signals.ServiceSignals(
        reading=True,
        reasons=("x",),
        idle_seconds=0.0,
        registered_workers=None,
        workers_answering=1,
        workers_unreachable=("w:1",),
        worker_tasks=2,
        worker_cpu_utilization_mean=0.5,
        worker_cpu_utilization_max=0.9,
        reporting_clients=0,
        client_stall_fraction_mean=None,
        client_stall_fraction_max=None,
        age_seconds=1.5,
    )
    assert signals.ServiceSignals.from_json(seen.to_json()) == seen
    with pytest.raises(signals.SignalsError, match=r"missing fields in signals: age_seconds, .*reading"):
        signals.ServiceSignals.from_json('{"reasons": []}')
    broken = seen.to_json().replace('"reading": true', '"reading": "yes"')
    with pytest.raises(signals.SignalsError, match="reading must be true or false"):
        signals.ServiceSignals.from_json(broken)
    # A dispatcher from before the clients' element rate: read as unknown, not refused.
    older = seen.to_json().replace('"client_elements_per_second": null, ', "")
    assert "client_elements_per_second" not in older
    assert signals.ServiceSignals.from_json(older).client_elements_per_second is None
    negative = seen.to_json().replace('"client_elements_per_second": null', '"client_elements_per_second": -1')
    with pytest.raises(signals.SignalsError, match="client_elements_per_second must be a number of at least 0"):
        signals.ServiceSignals.from_json(negative)


def journal_record(update: object) -> bytes:
    data = update.SerializeToString()  # type: ignore[attr-defined]
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4  # CRCs are not checked


def test_journal_counts_clients_attached_and_reads_only_what_was_appended(tmp_path: Path) -> None:
    update = update_class()
    directory = tmp_path / "tf_data_dispatcher_journal"
    directory.mkdir()
    acquire = [update(acquire={"client": n}) for n in (3000, 3001)]
    release = update(release={"client": 3000})
    journal = directory / "journal_0"
    journal.write_bytes(b"".join(journal_record(u) for u in acquire))
    clients = JournalClients(str(tmp_path))
    assert clients.attached() == 2
    record = journal_record(release)
    with open(journal, "ab") as f:
        f.write(record[:7])  # a record still being written is not read yet
    assert clients.attached() == 2
    with open(journal, "ab") as f:
        f.write(record[7:])
    assert clients.attached() == 1
    # A restarted dispatcher journals into the next file.
    (directory / "journal_1").write_bytes(journal_record(update(release={"client": 3001})))
    assert clients.attached() == 0


def test_journal_counts_each_jobs_clients_by_its_name_and_stays_bounded(tmp_path: Path) -> None:
    """Which job each attached client reads, from CreateJob and CreateIteration: a plain distribute()
    trainer counts too. Jobs without a name are one group; a name is cut as a report's is, and bytes
    that are not UTF-8 do not stop the read."""
    update = update_class()
    directory = tmp_path / "tf_data_dispatcher_journal"
    directory.mkdir()
    records = [
        update(create_job={"job": 1, "name": b"train"}),
        update(create_iteration={"iteration": 10, "job": 1}),
        update(create_job={"job": 2, "name": b"anonymous_job_2_15649073525674249438"}),  # read without a job_name
        update(create_iteration={"iteration": 20, "job": 2}),
        update(create_job={"job": 3, "name": b"anonymous_job_3_98765"}),
        update(create_iteration={"iteration": 30, "job": 3}),
        update(create_job={"job": 4, "name": b"\xff" + b"x" * 300}),
        update(create_iteration={"iteration": 40, "job": 4}),
        update(acquire={"iteration": 10, "client": 100}),
        update(acquire={"iteration": 10, "client": 101}),
        update(acquire={"iteration": 20, "client": 200}),
        update(acquire={"iteration": 30, "client": 300}),
        update(acquire={"iteration": 40, "client": 400}),
    ]
    journal = directory / "journal_0"
    journal.write_bytes(b"".join(journal_record(u) for u in records))
    clients = JournalClients(str(tmp_path))
    long_name = "\ufffd" + "x" * (signals.MAX_JOB_NAME - 1)
    assert clients.by_job() == {"train": 2, None: 2, long_name: 1}
    with open(journal, "ab") as f:
        f.write(journal_record(update(release={"client": 101})))
        f.write(journal_record(update(release={"client": 300})))
        f.write(journal_record(update(garbage_collect={"iteration": 30})))
    assert clients.by_job() == {"train": 1, None: 1, long_name: 1}
    assert clients.attached() == 3
    # Past MAX_TRACKED, the jobs and iterations no client reads are forgotten; those read are kept.
    clients.MAX_TRACKED = 3
    with open(journal, "ab") as f:
        for job in range(5, 10):
            f.write(journal_record(update(create_job={"job": job, "name": f"old-{job}".encode()})))
            f.write(journal_record(update(create_iteration={"iteration": job * 10, "job": job})))
    assert clients.by_job() == {"train": 1, None: 1, long_name: 1}
    assert len(clients._jobs) == 3 and len(clients._iterations) == 3


def test_jobs_list_the_clients_the_journal_attaches_reporting_or_not() -> None:
    """A job read by plain distribute() trainers is listed from the journal, with no stall; a job
    with reporting trainers gets the journal's count beside theirs; without a journal, None."""
    reports = [signals.ClientReport("t0", 0.6, 5.0, 50, job_name="train")]
    jobs, more = signals.job_readings(reports, {"train": 2, "plain": 3, None: 0})
    assert more == 0
    assert [(j.job_name, j.reporting_clients, j.attached_clients, j.client_stall_fraction_mean) for j in jobs] == [
        ("plain", 0, 3, None),
        ("train", 1, 2, pytest.approx(0.6)),
    ]
    (alone,), _ = signals.job_readings(reports)
    assert alone.attached_clients is None


def aggregator(
    workers: dict[str, WorkerReading], registered: float | None = None, **config: object
) -> tuple[Aggregator, Clock]:
    clock = Clock(100.0)
    base = {"port": 5050, "health_port": 8080, "worker_health_port": 8080, **config}
    agg = Aggregator(
        DispatcherServerConfig(**base),  # type: ignore[arg-type]
        lambda: registered,
        clock=clock,
        list_workers=lambda _: tuple(workers),
        read=lambda address, _: workers[address],
    )
    return agg, clock


@pytest.mark.parametrize(
    ("workers", "registered", "reading", "reason"),
    [
        ({"w0:1": WorkerReading("w0:1", 0), "w1:1": WorkerReading("w1:1", 0)}, 2, False, "no client is attached"),
        ({"w0:1": WorkerReading("w0:1", 1), "w1:1": WorkerReading("w1:1", 0)}, 2, True, "hold tasks"),
        # A worker that exists but does not answer might be the one serving a reader.
        ({"w0:1": WorkerReading("w0:1", 0), "w1:1": WorkerReading("w1:1", error="refused")}, 2, True, "did not answer"),
        # One whose name no longer resolves has no pod (DYNAMIC keeps removed workers registered).
        ({"w0:1": WorkerReading("w0:1", 0), "w1:1": WorkerReading("w1:1", error="nx", gone=True)}, 2, False, "no"),
        # Registered since the poll: not asked yet.
        ({"w0:1": WorkerReading("w0:1", 0)}, 2, True, "asked so far"),
    ],
    ids=["idle", "tasks", "silent-worker", "gone-worker", "new-worker"],
)
def test_reading_is_never_called_idle_without_knowing(
    workers: dict[str, WorkerReading], registered: float, reading: bool, reason: str
) -> None:
    agg, _ = aggregator(workers, registered)
    agg.poll_once()
    seen = agg.signals()
    assert seen.reading is reading, seen
    assert any(reason in r for r in seen.reasons), seen.reasons


def test_unknown_before_the_first_poll_and_idle_seconds_count_from_the_last_reader() -> None:
    readings = {"w0:1": WorkerReading("w0:1", 1, cpu_utilization=0.8)}
    agg, clock = aggregator(readings, 1)
    assert agg.signals().reading  # nothing read yet: unknown
    agg.poll_once()
    seen = agg.signals()
    assert seen.reading and seen.worker_cpu_utilization_max == pytest.approx(0.8)
    readings["w0:1"] = WorkerReading("w0:1", 0)
    agg.poll_once()
    clock.now += 7
    assert agg.signals().idle_seconds == pytest.approx(7)
    assert agg.clients.receive(report("t", stall=0.5)).status == 204
    seen = agg.signals()
    assert seen.reading and seen.idle_seconds == 0 and seen.client_stall_fraction_mean == pytest.approx(0.5)
    assert seen.client_elements_per_second == pytest.approx(2.0)  # 10 elements in a 5 s window
    # The clients' rates add up; a report with no window yet gives no rate.
    assert agg.clients.receive(signals.ClientReport("u", 0.1, 5.0, 40).to_json().encode()).status == 204
    assert agg.signals().client_elements_per_second == pytest.approx(10.0)
    assert agg.clients.receive(signals.ClientReport("v", 0.0, 0.0, 0).to_json().encode()).status == 204
    assert agg.signals().client_elements_per_second == pytest.approx(10.0)


def test_without_a_worker_health_port_the_answer_is_unknown() -> None:
    agg, _ = aggregator({"w0:1": WorkerReading("w0:1", 0)}, 1, worker_health_port=None)
    agg.poll_once()
    seen = agg.signals()
    assert seen.reading and "not asked" in seen.reasons[0]


def test_cpu_utilization_is_used_over_given_over_the_window() -> None:
    clock = Clock(100.0)
    cpu = {"child": 0.0}
    meter = metrics.CpuMeter((0.5, "config"), clock=clock, read_child=lambda _: cpu["child"], read_own=lambda: 1.0)
    meter.attach(42)
    assert meter.utilization() is None
    for _ in range(20):
        meter.sample()
        clock.now += 1
        cpu["child"] += 0.25  # a quarter core: half of the half core given
    assert meter.utilization() == pytest.approx(0.5)
    assert meter.total() == pytest.approx(1.0 + 5.0)


def job_report(client_id: str, job: str | None, stall: float, elements: int = 10) -> bytes:
    return signals.ClientReport(client_id, stall, 5.0, elements, job_name=job).to_json().encode()


def test_many_trainers_are_combined_and_one_that_stops_reporting_stops_counting() -> None:
    """What docs/autoscaling.md says the autoscaler reads: the reporting trainers' mean stall and
    their summed rate, over the trainers whose reports have not stopped (client_report_timeout_ms)."""
    agg, clock = aggregator({"w0:1": WorkerReading("w0:1", 1)}, 1, client_report_timeout_ms=15_000)
    agg.poll_once()
    assert agg.clients.receive(job_report("t0", "train", 0.6, elements=50)).status == 204
    assert agg.clients.receive(job_report("t1", "train", 0.2, elements=30)).status == 204
    assert agg.clients.receive(job_report("e0", "eval", 0.1)).status == 204
    both = agg.signals()
    assert both.reporting_clients == 3
    assert both.client_stall_fraction_mean == pytest.approx(0.3)
    assert both.client_stall_fraction_max == pytest.approx(0.6)
    assert both.client_elements_per_second == pytest.approx(18.0)  # (50 + 30 + 10) / 5 s
    assert both.jobs == (
        signals.JobReading("train", 2, pytest.approx(0.4), pytest.approx(0.6), pytest.approx(16.0)),
        signals.JobReading("eval", 1, pytest.approx(0.1), pytest.approx(0.1), pytest.approx(2.0)),
    )
    # t1 and e0 keep reporting; t0 goes silent and, past the timeout, counts no more.
    clock.now += 10
    assert agg.clients.receive(job_report("t1", "train", 0.2, elements=30)).status == 204
    assert agg.clients.receive(job_report("e0", "eval", 0.1)).status == 204
    clock.now += 6
    one = agg.signals()
    assert one.reporting_clients == 2
    assert one.client_stall_fraction_mean == pytest.approx(0.15)
    assert one.client_stall_fraction_max == pytest.approx(0.2)
    assert one.client_elements_per_second == pytest.approx(8.0)
    assert [(j.job_name, j.reporting_clients) for j in one.jobs or ()] == [("train", 1), ("eval", 1)]


def test_jobs_are_listed_busiest_first_and_bounded() -> None:
    reports = [signals.ClientReport(f"c{i}", 0.1, 5.0, 1, job_name=f"job-{i:02}") for i in range(20)]
    reports += [signals.ClientReport("x1", 0.9, 5.0, 1, job_name="job-19"), signals.ClientReport("n", 0.5, 5.0, 1)]
    jobs, more = signals.job_readings(reports)
    assert len(jobs) == signals.MAX_JOBS and more == 21 - signals.MAX_JOBS
    assert (jobs[0].job_name, jobs[0].reporting_clients) == ("job-19", 2)
    assert jobs[1].job_name is None  # trainers without a job name: one group; higher stall before the rest
    assert [j.job_name for j in jobs[2:4]] == ["job-00", "job-01"]


def test_signals_with_jobs_round_trip_and_an_older_dispatcher_lists_none() -> None:
    clients = [signals.ClientReport("a", 0.5, 5.0, 10, job_name="train"), signals.ClientReport("b", 0.1, 5.0, 10)]
    jobs, more = signals.job_readings(clients)
    seen = signals.ServiceSignals(
        reading=True, reasons=("x",), idle_seconds=0.0, registered_workers=1, workers_answering=1,
        workers_unreachable=(), worker_tasks=1, worker_cpu_utilization_mean=0.5, worker_cpu_utilization_max=0.5,
        reporting_clients=2, client_stall_fraction_mean=0.3, client_stall_fraction_max=0.5, age_seconds=1.0,
        client_elements_per_second=4.0, jobs=jobs, jobs_not_listed=more,
    )  # fmt: skip
    assert signals.ServiceSignals.from_json(seen.to_json()) == seen
    document = json.loads(seen.to_json())
    older = {k: v for k, v in document.items() if k not in ("jobs", "jobs_not_listed")}
    assert signals.ServiceSignals.from_json(json.dumps(older)).jobs is None  # cannot tell: not "no job"
    # A job's journal count: an integer of at least 0, absent from an older dispatcher's document.
    assert document["jobs"][0]["attached_clients"] is None
    for bad in (-1, True, "2"):
        job = {**document["jobs"][0], "attached_clients": bad}
        with pytest.raises(signals.SignalsError, match="attached_clients must be an integer"):
            signals.ServiceSignals.from_json(json.dumps({**document, "jobs": [job]}))
    job = {k: v for k, v in document["jobs"][0].items() if k != "attached_clients"}
    assert signals.ServiceSignals.from_json(json.dumps({**document, "jobs": [job]})).jobs[0].attached_clients is None
    # A document listing more than MAX_JOBS is cut, and what is cut is counted.
    many = {**document, "jobs": [document["jobs"][0]] * (signals.MAX_JOBS + 3), "jobs_not_listed": 2}
    read = signals.ServiceSignals.from_json(json.dumps(many))
    assert len(read.jobs or ()) == signals.MAX_JOBS and read.jobs_not_listed == 5
    for job, message in (
        ({"job_name": "x" * 257, "reporting_clients": 1}, "job_name must be a string of at most 256"),
        ({"job_name": "x", "reporting_clients": -1}, "reporting_clients must be an integer of at least 0"),
        ({"job_name": "x", "reporting_clients": 1, "client_stall_fraction_mean": "high"}, "must be a number"),
        ("train", "each of jobs must be a JSON object"),
    ):
        with pytest.raises(signals.SignalsError, match=message):
            signals.ServiceSignals.from_json(json.dumps({**document, "jobs": [job]}))
    with pytest.raises(signals.SignalsError, match="jobs must be a list"):
        signals.ServiceSignals.from_json(json.dumps({**document, "jobs": {"train": 1}}))
