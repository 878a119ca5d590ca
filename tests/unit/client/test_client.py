"""The client helper's pure parts: processing-mode advice, settings, the stall meter, a fit's reporter and reports."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tfdata_operator import client
from tfdata_operator.client import fingerprint as fp
from tfdata_operator.client.stall import INTERVAL_SECONDS, StallMeter, StallReporter
from tfdata_operator.wire import discovery, serverconfig, signals

from fixtures.fakes import Clock


def settings(policy: str, name: str = "imagenet") -> discovery.ClientSettings:
    return discovery.ClientSettings(address="grpc://d:5050", sharding_policy=policy, processing_mode=policy,
                                    service_name=name)  # fmt: skip


def test_importing_the_client_imports_neither_tensorflow_nor_any_other_package() -> None:
    """A plain copy of the helper then runs on any TensorFlow image (tests/server runs one on TensorFlow 2.16)."""
    code = (
        "import sys, tfdata_operator.client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'google_crc32c', 'click', 'yaml'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "[]", f"imported with the helper: {done.stdout}"


@pytest.mark.parametrize(
    ("policy", "given", "advice"),
    [
        ("FILE", "DYNAMIC", "would ignore them"),
        ("FILE", "parallel_epochs", "once per worker"),
        ("DYNAMIC", "FILE", "needs a dispatcher started with the worker list"),
    ],
)
def test_a_contradicting_mode_says_which_to_use(policy: str, given: str, advice: str) -> None:
    with pytest.raises(client.ProcessingModeError) as caught:
        client.check_processing_mode(settings(policy), given)
    message = str(caught.value)
    assert f"service 'imagenet' shards with {policy}" in message
    assert f"Use processing_mode=tf.data.experimental.service.ShardingPolicy.{policy}" in message
    assert advice in message


def test_the_needed_mode_is_used_when_none_or_the_same_is_given() -> None:
    assert client.check_processing_mode(settings("DYNAMIC"), None) == "DYNAMIC"
    assert client.check_processing_mode(settings("DYNAMIC"), "distributed_epoch") == "DYNAMIC"
    assert client.check_processing_mode(settings("HINT"), "hint") == "HINT"


def test_explicit_settings_need_address_and_policy_together() -> None:
    assert client.resolve(None, "grpc://d:1", "file").processing_mode == "FILE"
    with pytest.raises(discovery.DiscoveryError, match="needs sharding_policy= too"):
        client.resolve(None, "grpc://d:1", None)
    with pytest.raises(discovery.DiscoveryError, match="needs address= too"):
        client.resolve(None, None, "FILE")


def test_static_policies_warn_that_reads_are_not_local() -> None:
    with pytest.warns(client.LocalReadsWarning, match="target_workers='LOCAL'"):
        client.warn_local_reads(settings("FILE"), "AUTO")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client.warn_local_reads(settings("FILE"), "LOCAL")
        client.warn_local_reads(settings("DYNAMIC"), "AUTO")


def test_claims_round_trip_through_their_keys() -> None:
    chain = (fp.Transformation("RangeDataset", (), "a" * 64), fp.Transformation("MapDataset", ("f",), "b" * 64))
    claim = client.Claim("c" * 64, "{'x': int64[None, 3]}", chain)
    back = client.Claim.from_keys(claim.marker_keys())
    assert (back.fingerprint, back.element_spec) == (claim.fingerprint, claim.element_spec)
    assert [(t.op, t.functions, t.digest) for t in back.transformations] == [
        ("RangeDataset", (), "a" * 16),
        ("MapDataset", ("f",), "b" * 16),
    ]


def test_the_differing_transformation_is_named() -> None:
    ours = (fp.Transformation("RangeDataset", (), "1"), fp.Transformation("MapDataset", ("Dataset_map_parse",), "2"))
    theirs = (ours[0], fp.Transformation("MapDataset", ("Dataset_map_decode",), "3"))
    assert fp.difference(ours, theirs) == (
        "transformation 2 of 2, MapDataset(Dataset_map_parse) (there: MapDataset(Dataset_map_decode)), "
        "differs in its function or settings"
    )
    assert "different transformations: here RangeDataset; there RangeDataset -> MapDataset" in fp.difference(
        ours[:1], theirs
    )


def slow_source(clock: Clock, waits: list[float]) -> Iterator[int]:
    for i, wait in enumerate(waits):
        clock.now += wait
        yield i


def test_stall_fraction_is_the_share_of_wall_time_spent_waiting() -> None:
    clock = Clock(100.0)
    sent: list[signals.ClientReport] = []
    meter = StallMeter(slow_source(clock, [0.5, 0.5]), "http://x/", "train", interval=3600,
                       send=lambda url, r: sent.append(r), clock=clock)  # fmt: skip
    for _ in meter:
        clock.now += 1.5  # a training step
    assert meter.total_elements == 2
    assert meter.stall_fraction == pytest.approx(1.0 / 4.0)
    assert len(sent) == 1, "exactly one final report"
    final = sent[0]
    assert final.done and final.job_name == "train" and final.elements == 2
    assert final.stall_fraction == pytest.approx(0.25)
    final.validate()


class Receiver:
    """A real HTTP endpoint on 127.0.0.1 that keeps the reports it gets (or refuses them)."""

    def __init__(self, status: int = 204) -> None:
        self.reports: list[signals.ClientReport] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.reports.append(signals.ClientReport.from_json(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{signals.REPORT_PATH}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_reports_reach_the_dispatcher_pod_periodically_and_once_done() -> None:
    receiver = Receiver()
    try:
        release = threading.Event()

        def source() -> Iterator[int]:
            yield 1
            release.wait(5)  # the loop waits here while the periodic reports go out
            yield 2

        meter = StallMeter(source(), receiver.url, "train", interval=0.05)
        assert next(meter) == 1
        deadline_reports = 3
        for _ in range(100):
            if len(receiver.reports) >= deadline_reports:
                break
            threading.Event().wait(0.05)
        release.set()
        assert list(meter) == [2]
        assert len(receiver.reports) > deadline_reports, f"periodic reports: {receiver.reports}"
        assert [r.done for r in receiver.reports].count(True) == 1 and receiver.reports[-1].done
        assert sum(r.elements for r in receiver.reports) == 2
        assert len({r.client_id for r in receiver.reports}) == 1
    finally:
        receiver.close()


def test_failed_reports_never_break_training(caplog: pytest.LogCaptureFixture) -> None:
    refusing = Receiver(status=500)
    try:
        assert list(StallMeter(iter(range(3)), refusing.url, None, interval=0.01)) == [0, 1, 2]
    finally:
        refusing.close()
    # Nothing listens on the closed port at all.
    with StallMeter(iter(range(3)), refusing.url, None, interval=0.01) as meter:
        assert next(meter) == 0
    assert "cannot send the data-stall report" in caplog.text
    assert json.loads(signals.ClientReport("a", 0.0, 0.0, 0).to_json())["done"] is False


def test_a_fits_reporter_counts_what_the_stages_counters_gained_while_the_fit_ran() -> None:
    """The stage ``distribute()`` appends adds to two running totals (``fit.totals``); a fit's reporter reads
    them when it reports, and counts only what they gained since it was made: not an earlier fit's elements,
    nor another loop's before it began."""
    clock = Clock(100.0)
    counters = [7.5, 40]  # seconds waited, elements: what earlier fits and loops left in them
    sent: list[signals.ClientReport] = []
    reporter = StallReporter("http://x/", "train", interval=3600, send=lambda url, r: sent.append(r), clock=clock,
                             quiet_until_first=True, poll=lambda: (counters[0], int(counters[1])))  # fmt: skip
    for waited in (0.3, 0.1, 0.0):
        counters[0] += waited
        counters[1] += 1
        clock.now += 1.0
    reporter.poll()
    window = reporter.take_report()
    assert (window.elements, window.window_seconds) == (3, pytest.approx(3.0))
    assert window.stall_fraction == pytest.approx(0.4 / 3.0)
    clock.now += 2.0
    reporter.close()
    (final,) = sent
    assert final.done and final.elements == 0 and final.window_seconds == pytest.approx(2.0)
    assert reporter.total_elements == 3 and reporter.total_waited == pytest.approx(0.4)


def test_two_fits_in_a_row_report_their_own_windows() -> None:
    """The counters live as long as the process; each fit's reporter starts from what they hold then."""
    counters = [0.0, 0]
    finals: list[signals.ClientReport] = []

    def totals() -> tuple[float, int]:
        return counters[0], int(counters[1])

    for waited_each in (0.5, 0.01):  # a fit that waits on data, then one that hardly does
        clock = Clock(0.0)
        reporter = StallReporter("http://x/", "train", interval=3600, send=lambda url, r: finals.append(r),
                                 clock=clock, quiet_until_first=True, poll=totals)  # fmt: skip
        for _ in range(10):
            counters[0] += waited_each
            counters[1] += 1
            clock.now += 1.0
        reporter.close()
    first, second = finals
    assert (first.elements, second.elements) == (10, 10)
    assert first.stall_fraction == pytest.approx(0.5) and second.stall_fraction == pytest.approx(0.01)


def test_a_reporter_whose_counters_cannot_be_read_still_closes() -> None:
    """Reading the counters fails (TensorFlow shutting down): the fit ends as if nothing was measured."""

    calls: list[int] = []

    def breaks_after_the_first_read() -> tuple[float, int]:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("gone")
        return 0.0, 0

    sent: list[signals.ClientReport] = []
    reporter = StallReporter("http://x/", None, interval=3600, send=lambda url, r: sent.append(r),
                             poll=breaks_after_the_first_read)  # fmt: skip
    reporter.close()
    assert [r.done for r in sent] == [True] and sent[0].elements == 0


def test_a_fits_reporter_sends_nothing_before_its_first_element_but_done() -> None:
    """Measured nothing yet (the fit has not started reading, or its dataset is not from distribute()): a stall
    fraction of 0 would tell the autoscaler the data keeps up."""
    sent: list[signals.ClientReport] = []
    reporter = StallReporter("http://x/", None, interval=0.01, send=lambda url, r: sent.append(r),
                             quiet_until_first=True)  # fmt: skip
    threading.Event().wait(0.1)
    assert sent == []
    reporter.add(0.01, 1)
    for _ in range(100):
        if sent:
            break
        threading.Event().wait(0.02)
    reporter.close()
    assert sent and sent[0].elements == 1 and not sent[0].done, sent
    assert [r.done for r in sent].count(True) == 1 and sent[-1].done


def test_stall_reports_go_where_iterate_sends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "_last", {})
    environ = {"TFDATA_SERVICE_ADDRESS": "grpc://d:5050", "TFDATA_SHARDING_POLICY": "DYNAMIC",
               "TFDATA_SERVICE_NAME": "imagenet", "TFDATA_REPORT_URL": "http://d:8080/v1/client-report"}  # fmt: skip
    assert client.report_target("imagenet", None, "run-1", environ) == ("http://d:8080/v1/client-report", "run-1")
    assert client.report_target(None, "http://elsewhere/", None, environ) == ("http://elsewhere/", None)
    assert client.report_target("imagenet", None, None, {}, "/nonexistent") == (None, None)


def test_a_live_trainer_is_forgotten_only_after_two_reports_in_a_row_are_lost() -> None:
    """The reporter's cadence against the dispatcher's default for forgetting a silent trainer: a
    report sent every 10 s against a 15 s timeout dropped a live trainer whenever one was late."""
    forget = serverconfig.DEFAULTS["client_report_timeout_ms"] / 1000
    assert INTERVAL_SECONDS == signals.REPORT_EVERY_SECONDS
    assert forget >= INTERVAL_SECONDS * 3, (INTERVAL_SECONDS, forget)
