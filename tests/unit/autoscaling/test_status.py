"""status.autoscaling and the scale Event: what a person reads, and how often it is written."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import yaml

from tfdata_operator.api import diff
from tfdata_operator.autoscaling import status as autoscalestatus
from tfdata_operator.autoscaling.policy import History, LastScale, ScaleDecision
from tfdata_operator.autoscaling.readings import ServiceWindow
from tfdata_operator.wire.signals import JobReading, ServiceSignals

from fixtures.cases import CRD_PATH, STALLED_SIGNALS

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
SIGNALS = STALLED_SIGNALS
REASON = "trainers waited on data 38% of the time, workers at 95% CPU"
SCALE = ScaleDecision(2, 4, REASON, 5.0, History(LastScale(T0.timestamp(), 2, 4)))
HOLD = ScaleDecision(
    4, 4, "trainers waited on data 2% of the time, workers at 60% CPU: the trainers are fed", 5.0, History()
)


def window(signals: ServiceSignals | None = SIGNALS, error: str | None = None) -> ServiceWindow:
    return ServiceWindow(latest=signals, last_error=error)


def test_a_scale_is_an_event_and_the_status_says_why() -> None:
    assert autoscalestatus.event_message(SCALE) == f"Scaled workers from 2 to 4: {REASON}"
    block = autoscalestatus.build(None, SCALE, window(), T0)
    assert block == {
        "metric": "TFData",
        "desiredReplicas": 4,
        "reason": REASON,
        "observedTime": "2025-03-01T12:00:00Z",
        "signals": {
            "reading": True,
            "dataStallPercent": 38,
            "workerCPUPercent": 95,
            "reportingClients": 1,
            "elementsPerSecond": 61.2,
            "workersAnswering": 2,
            "jobs": [{"name": "train", "trainers": 1, "dataStallPercent": 38, "maxDataStallPercent": 38}],
            "jobsNotListed": None,
            "jobsNote": None,
            "error": None,
        },
        "lastScale": {"time": "2025-03-01T12:00:00Z", "fromReplicas": 2, "toReplicas": 4, "reason": REASON},
    }


def test_plain_trainers_and_a_failed_read_leave_no_stale_values() -> None:
    plain = replace(SIGNALS, reporting_clients=0, client_stall_fraction_mean=None, client_stall_fraction_max=None)
    assert plain.client_elements_per_second is not None  # a stale rate is not shown either
    block = autoscalestatus.build(None, HOLD, window(plain, "GET x failed: timed out"), T0)
    assert block["signals"]["dataStallPercent"] is None  # a merge patch removes it
    assert block["signals"]["elementsPerSecond"] is None
    assert block["signals"]["error"] == "GET x failed: timed out"
    assert block["lastScale"] is None
    unknown = autoscalestatus.build(None, HOLD, window(None, "GET x answered 503 Service Unavailable"), T0)
    assert unknown["signals"]["reading"] is None


def test_readings_that_wobble_are_written_at_most_every_refresh() -> None:
    first = autoscalestatus.build(None, HOLD, window(), T0)
    wobble = replace(HOLD, reason=HOLD.reason.replace("60%", "61%"))
    soon = T0 + timedelta(seconds=autoscalestatus.REFRESH_SECONDS - 1)
    assert autoscalestatus.build(first, wobble, window(), soon) == first
    later = T0 + timedelta(seconds=autoscalestatus.REFRESH_SECONDS)
    refreshed = autoscalestatus.build(first, wobble, window(), later)
    assert refreshed["reason"] == wobble.reason and refreshed["observedTime"] == "2025-03-01T12:00:30Z"
    # The last scale stays until the next one.
    assert refreshed["lastScale"] == first["lastScale"]


def test_a_steady_service_writes_nothing() -> None:
    idle = replace(SIGNALS, reading=False, worker_cpu_utilization_mean=0.0, reporting_clients=0)
    quiet = ScaleDecision(1, 1, "no client reads", 15.0, History())
    first = autoscalestatus.build(None, quiet, window(idle), T0)
    hour = T0 + timedelta(hours=1)
    again = autoscalestatus.build(first, quiet, window(replace(idle, idle_seconds=3600.0)), hour)
    assert again == first and not diff.changes(first, again, removes=True)


def test_a_scale_is_written_at_once() -> None:
    first = autoscalestatus.build(None, HOLD, window(), T0)
    down = ScaleDecision(4, 1, "no client has read for 300s", 5.0, History())
    block = autoscalestatus.build(first, down, window(), T0 + timedelta(seconds=1))
    assert block["desiredReplicas"] == 1
    assert block["lastScale"]["fromReplicas"] == 4 and block["lastScale"]["time"] == "2025-03-01T12:00:01Z"


def test_a_restarted_operator_remembers_the_last_scale() -> None:
    block = autoscalestatus.build(None, SCALE, window(), T0)
    assert autoscalestatus.history_from_status(block) == History(LastScale(T0.timestamp(), 2, 4))
    assert autoscalestatus.history_from_status(None) == History()
    assert autoscalestatus.history_from_status({"lastScale": {"time": "yesterday"}}) == History()


def _schema_fields(schema: dict[str, Any], prefix: str = "") -> set[str]:
    found = set()
    for key, sub in (schema.get("properties") or {}).items():
        found.add(prefix + key)
        found |= _schema_fields(sub, f"{prefix}{key}.")
    return found


def _block_fields(block: dict[str, Any], prefix: str = "") -> set[str]:
    found = set()
    for key, value in block.items():
        found.add(prefix + key)
        if isinstance(value, dict):
            found |= _block_fields(value, f"{prefix}{key}.")
    return found


def test_the_crd_declares_every_field_the_block_writes() -> None:
    # The API server drops undeclared status fields silently: the schema must declare all of them.
    crd = yaml.safe_load(CRD_PATH.read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    declared = _schema_fields(status["properties"]["autoscaling"])
    assert _block_fields(autoscalestatus.build(None, SCALE, window(), T0)) == declared


def test_each_jobs_trainers_are_listed_bounded_and_their_names_fit_the_crd() -> None:
    hostile = "\x1b[31mred\x1b[0m\njob\u202e" + "x" * 400  # names come from the trainers' reports
    jobs = (
        JobReading(hostile, 3, 0.5, 0.9, 30.0, attached_clients=4),
        JobReading(None, 1, 0.1, 0.1, None),  # trainers that gave no job name
        JobReading("plain", 0, None, None, None, attached_clients=2),  # plain distribute() trainers only
    )
    many = replace(SIGNALS, reporting_clients=4, jobs=jobs, jobs_not_listed=7)
    block = autoscalestatus.build(None, HOLD, window(many), T0)
    listed = block["signals"]["jobs"]
    assert listed[1] == {"trainers": 1, "dataStallPercent": 10, "maxDataStallPercent": 10}  # no null in an item
    name = listed[0]["name"]
    assert len(name) == 256 and name.startswith("red job") and name.endswith("…"), name
    assert not any(c in name for c in "\x1b\n\u202e")
    assert listed[0]["trainers"] == 3 and listed[0]["maxDataStallPercent"] == 90 and listed[0]["clients"] == 4
    assert listed[2] == {"name": "plain", "trainers": 0, "clients": 2}
    assert block["signals"]["jobsNotListed"] == 7 and block["signals"]["jobsNote"] is None
    # A dispatcher older than the job list: nothing listed, and a note that says why.
    older = autoscalestatus.build(None, HOLD, window(replace(SIGNALS, jobs=None)), T0)
    assert older["signals"]["jobs"] is None and "older" in older["signals"]["jobsNote"]
    assert len(older["signals"]["jobsNote"]) <= 256
    # No reading at all: neither.
    unknown = autoscalestatus.build(None, HOLD, window(None, "GET x timed out"), T0)
    assert unknown["signals"]["jobs"] is None and unknown["signals"]["jobsNote"] is None
    # What is written validates against the CRD's bounds (maxItems, maxLength).
    schema = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    signal_schema = schema["properties"]["status"]["properties"]["autoscaling"]["properties"]["signals"]
    job_schema = signal_schema["properties"]["jobs"]
    assert job_schema["maxItems"] >= len(listed) and job_schema["items"]["properties"]["name"]["maxLength"] == 256
    assert set(listed[0]) <= set(job_schema["items"]["properties"])
