"""What trainers report to a dispatcher pod, one typed model for both sides.

A trainer that reads through the client helper (``tfdata_operator.client``) measures how
long its training loop waits for data and sends it, as JSON, to the dispatcher pod's health
port at ``REPORT_PATH``. The dispatcher's server program aggregates the reports with its own
and its workers' signals; the operator reads the result from the dispatcher alone, so the
decision needs neither Prometheus nor a request per trainer.

Like ``serverconfig``, this module imports neither TensorFlow nor the Kubernetes client:
the trainer, the server program and the operator all import it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

# POST, body: one ClientReport as JSON; answered 204, or 400 with what is wrong (413 when
# the body is too large, 429 when the dispatcher already tracks as many clients as it may).
REPORT_PATH = "/v1/client-report"
# A reading client reports at least this often. The dispatcher forgets a client whose reports
# stop for ``client_report_timeout_ms`` (serverconfig; 15 s by default, three missed reports).
REPORT_EVERY_SECONDS = 5.0
# GET: one ServiceSignals as JSON, answered by the dispatcher pod's health port.
SIGNALS_PATH = "/v1/signals"
# A client id is chosen by the trainer (host, pid and a random part) and only names it.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# The most jobs a signals document lists (the busiest first); the rest are only counted.
MAX_JOBS = 16
# The longest job name a report may carry (ClientReport.validate) and a document may list.
MAX_JOB_NAME = 256


def json_object(text: str | bytes, what: str, error: type[Exception]) -> dict[str, Any]:
    """``text`` parsed as a JSON object; otherwise ``error`` saying that ``what`` must be one."""
    try:
        data: Any = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise error(f"{what} must be a JSON object: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} must be a JSON object")
    return data


class ReportError(ValueError):
    """A report that cannot be used; the message says what is wrong."""


@dataclass(frozen=True)
class ClientReport:
    """One trainer's view of the service over the last ``window_seconds``.

    ``stall_fraction`` is the time the training loop waited in ``next()`` divided by the
    window's wall time (0 = never waited, 1 = did nothing but wait). ``done`` is sent once,
    when the trainer stops reading (the iterator is exhausted or closed), so a reader that
    leaves is forgotten at once rather than when its reports stop.
    """

    client_id: str
    stall_fraction: float
    window_seconds: float
    elements: int
    job_name: str | None = None
    done: bool = False

    def validate(self) -> None:
        if not isinstance(self.client_id, str) or not _CLIENT_ID.fullmatch(self.client_id):
            raise ReportError(f"client_id must match {_CLIENT_ID.pattern}, got {self.client_id!r}")
        if not _number(self.stall_fraction) or not 0.0 <= self.stall_fraction <= 1.0:
            raise ReportError(f"stall_fraction must be a number from 0 to 1, got {self.stall_fraction!r}")
        if not _number(self.window_seconds) or self.window_seconds < 0:
            raise ReportError(f"window_seconds must be a number of at least 0, got {self.window_seconds!r}")
        if isinstance(self.elements, bool) or not isinstance(self.elements, int) or self.elements < 0:
            raise ReportError(f"elements must be an integer of at least 0, got {self.elements!r}")
        if self.job_name is not None and (not isinstance(self.job_name, str) or len(self.job_name) > MAX_JOB_NAME):
            raise ReportError(f"job_name must be a string of at most {MAX_JOB_NAME} characters, got {self.job_name!r}")
        if not isinstance(self.done, bool):
            raise ReportError(f"done must be true or false, got {self.done!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ClientReport:
        data = json_object(text, "a client report", ReportError)
        known = set(cls.__dataclass_fields__)
        if unknown := sorted(set(data) - known):
            raise ReportError(f"unknown fields in a client report: {', '.join(unknown)}")
        if missing := sorted(n for n in ("client_id", "stall_fraction", "window_seconds", "elements") if n not in data):
            raise ReportError(f"missing fields in a client report: {', '.join(missing)}")
        report = cls(**data)
        report.validate()
        return report


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class SignalsError(ValueError):
    """A signals document the operator cannot use; the message says what is wrong."""


@dataclass(frozen=True)
class JobReading:
    """The trainers of one job, as a dispatcher groups them by ``job_name``: those that report (by
    their reports' name), and those attached to it by the dispatcher's journal, reporting or not.

    ``job_name`` is None for clients that read without one (each of those reads its own job:
    they are grouped together here). The stall fractions are over the reporting clients' last
    reports (None: none reports). ``attached_clients`` is None without a journal to read (a
    dispatcher without fault tolerance, or older than the field).
    """

    job_name: str | None
    reporting_clients: int
    client_stall_fraction_mean: float | None
    client_stall_fraction_max: float | None
    client_elements_per_second: float | None = None
    attached_clients: int | None = None


def job_readings(
    clients: list[ClientReport], attached: Mapping[str | None, int] | None = None
) -> tuple[tuple[JobReading, ...], int]:
    """``clients`` grouped by job, with the clients ``attached`` to each by the dispatcher's journal
    (None: not known), the busiest (most clients, then highest stall) first, at most ``MAX_JOBS``
    of them; and how many more jobs there are."""
    by_job: dict[str | None, list[ClientReport]] = {}
    for client in clients:
        by_job.setdefault(client.job_name, []).append(client)
    jobs = []
    # The jobs with reporting clients, then those only the journal names (plain distribute() trainers).
    read_only = [n for n, count in (attached or {}).items() if count and n not in by_job]
    for name in [*by_job, *read_only]:
        reports = by_job.get(name, [])
        stalls = [c.stall_fraction for c in reports]
        timed = [c for c in reports if c.window_seconds > 0]
        jobs.append(
            JobReading(
                job_name=name,
                reporting_clients=len(reports),
                client_stall_fraction_mean=sum(stalls) / len(stalls) if stalls else None,
                client_stall_fraction_max=max(stalls) if stalls else None,
                client_elements_per_second=sum(c.elements / c.window_seconds for c in timed) if timed else None,
                attached_clients=None if attached is None else attached.get(name, 0),
            )
        )
    jobs.sort(
        key=lambda j: (
            -max(j.reporting_clients, j.attached_clients or 0),
            -(j.client_stall_fraction_max or 0.0),
            j.job_name or "",
        )
    )
    return tuple(jobs[:MAX_JOBS]), max(0, len(jobs) - MAX_JOBS)


def _job_reading(value: Any) -> JobReading:
    if not isinstance(value, dict):
        raise SignalsError(f"each of jobs must be a JSON object, got {value!r}")
    known = {f.name for f in fields(JobReading)}
    values: dict[str, Any] = {name: value.get(name) for name in known}
    name = values["job_name"]
    if name is not None and (not isinstance(name, str) or len(name) > MAX_JOB_NAME):
        raise SignalsError(f"a job's job_name must be a string of at most {MAX_JOB_NAME} characters, got {name!r}")
    for key in ("reporting_clients", "attached_clients"):
        count = values[key]
        if count is None and key == "attached_clients":
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SignalsError(f"a job's {key} must be an integer of at least 0, got {count!r}")
    for key in ("client_stall_fraction_mean", "client_stall_fraction_max", "client_elements_per_second"):
        number = values[key]
        if number is not None and (not _number(number) or number < 0):
            raise SignalsError(f"a job's {key} must be a number of at least 0, got {number!r}")
    return JobReading(**values)


@dataclass(frozen=True)
class ServiceSignals:
    """What a dispatcher pod says about its service at ``SIGNALS_PATH``: one read per decision.

    ``reading`` answers "is any client reading?". It is True while any worker holds a task
    (TensorFlow keeps a task on every worker for as long as a client is attached to its job,
    also a client that steps slowly or reports nothing), while a reporting client has not said
    ``done``, or whenever the answer is not known (a worker list that could not be read, no
    registered worker answering): the signal never calls a busy service idle. ``reasons``
    says why, for a person. ``idle_seconds`` is how long it has been False (0 while True), so
    a decision can ask for a quiet moment rather than one idle sample. docs/concepts.md ("Is any
    client reading?") gives the bounds for how soon it turns False.

    The rest are the autoscaler's inputs, ``None`` when unknown: worker CPU used over CPU given
    (mean and max over the workers that answered), the reporting clients' data-stall fraction,
    and the elements per second they read in all (over their last reports' windows), which says
    whether more workers made them faster when the stall alone cannot (an I/O-bound pipeline:
    the trainers wait all the time before and after a step, only faster). Fields with a default
    came later: a document from an older dispatcher, without them, reads as ``None``.

    ``jobs`` groups the reporting clients by job (``JobReading``), at most ``MAX_JOBS``, the
    busiest first; ``jobs_not_listed`` counts the other jobs. ``jobs`` is None in a document from
    a dispatcher older than the field, which cannot tell: not the same as ``()``, no job reported.
    """

    reading: bool
    reasons: tuple[str, ...]
    idle_seconds: float
    registered_workers: int | None
    workers_answering: int
    workers_unreachable: tuple[str, ...]
    worker_tasks: int
    worker_cpu_utilization_mean: float | None
    worker_cpu_utilization_max: float | None
    reporting_clients: int
    client_stall_fraction_mean: float | None
    client_stall_fraction_max: float | None
    # Seconds since the dispatcher last read its workers (the signal is at most this old).
    age_seconds: float
    client_elements_per_second: float | None = None
    jobs: tuple[JobReading, ...] | None = None
    jobs_not_listed: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ServiceSignals:
        try:
            data: Any = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise SignalsError(f"signals must be a JSON object: {exc}") from exc
        if not isinstance(data, dict):
            raise SignalsError("signals must be a JSON object")
        required = {f.name for f in fields(cls) if f.default is MISSING}
        if missing := sorted(required - set(data)):
            raise SignalsError(f"missing fields in signals: {', '.join(missing)} (a dispatcher of another version?)")
        # Newer dispatchers may add fields; older ones lack those with a default.
        values = {f.name: data.get(f.name, f.default) for f in fields(cls)}
        for name in ("reading",):
            if not isinstance(values[name], bool):
                raise SignalsError(f"{name} must be true or false, got {values[name]!r}")
        for name in ("reasons", "workers_unreachable"):
            if not isinstance(values[name], list) or not all(isinstance(v, str) for v in values[name]):
                raise SignalsError(f"{name} must be a list of strings, got {values[name]!r}")
            values[name] = tuple(values[name])
        if values["jobs"] is not None:
            if not isinstance(values["jobs"], list):
                raise SignalsError(f"jobs must be a list, got {values['jobs']!r}")
            listed = [_job_reading(job) for job in values["jobs"]]
            if not isinstance(values["jobs_not_listed"], int) or isinstance(values["jobs_not_listed"], bool):
                raise SignalsError(f"jobs_not_listed must be an integer, got {values['jobs_not_listed']!r}")
            # Bounded here too: what the operator keeps and writes does not grow with the document.
            values["jobs_not_listed"] = max(0, values["jobs_not_listed"]) + max(0, len(listed) - MAX_JOBS)
            values["jobs"] = tuple(listed[:MAX_JOBS])
        for name in ("workers_answering", "worker_tasks", "reporting_clients", "registered_workers"):
            value = values[name]
            if value is None and name == "registered_workers":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SignalsError(f"{name} must be an integer of at least 0, got {value!r}")
        optional = (
            "worker_cpu_utilization_mean",
            "worker_cpu_utilization_max",
            "client_stall_fraction_mean",
            "client_stall_fraction_max",
            "client_elements_per_second",
        )
        for name in ("idle_seconds", "age_seconds", *optional):
            value = values[name]
            if value is None and name in optional:
                continue
            if not _number(value) or value < 0:
                raise SignalsError(f"{name} must be a number of at least 0, got {value!r}")
        return cls(**values)
