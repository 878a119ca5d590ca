"""The bounds of the operator's reads of the tenants' pods (controller/readers.py): a pod that did not
answer is not asked again until its back-off has passed (5 s, doubling, up to 2 minutes, reset by a
good answer), and at most 2 reads of one namespace's pods run at once, a third not waiting for a
thread. Time is a clock the test moves; the cap's reads under way are real threads."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from tfdata_operator.controller import readers
from tfdata_operator.controller.readers import Backoff, NamespaceCap, SnapshotReaders, Unasked
from tfdata_operator.wire.serverinfo import GraphDefVersions, ServerInfo
from tfdata_operator.wire.snapshots import SnapshotsReport

from fixtures.fakes import Clock

URL = "http://10.0.0.9:8080/v1/snapshots?path=gs%3A%2F%2Fbucket%2Fs"
OTHER = "http://10.0.0.10:8080/v1/snapshots?path=gs%3A%2F%2Fbucket%2Fs"
REPORT = SnapshotsReport((), "journal")


def test_the_back_off_doubles_from_5_s_up_to_2_minutes_and_a_good_answer_resets_it() -> None:
    backoff, now = Backoff(), 1000.0
    waits = [backoff.failed("pod", now, "timed out") for _ in range(8)]
    assert waits == [5, 10, 20, 40, 80, 120, 120, 120]
    assert backoff.held("pod", now) == (120, 120, "timed out")
    assert backoff.held("pod", now + 119.5) == (0.5, 120, "timed out")
    assert backoff.held("pod", now + 120) is None  # its time has come: it is asked again
    assert backoff.held("other", now) is None
    backoff.answered("pod")
    assert backoff.held("pod", now) is None
    assert backoff.failed("pod", now, "refused") == 5


def test_pods_not_heard_of_for_long_are_forgotten() -> None:
    backoff = Backoff()
    backoff.failed("gone", 0.0, "timed out")
    backoff.failed("other", 1000.0, "timed out")
    assert len(backoff) == 1


class Dispatcher:
    """A dispatcher's answers in turn, counting the times it is asked."""

    def __init__(self, *answers: SnapshotsReport | str) -> None:
        self.answers, self.asked = list(answers), 0

    def __call__(self, url: str) -> SnapshotsReport | str:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_dispatcher_that_does_not_answer_is_not_asked_again_until_its_back_off_has_passed() -> None:
    clock = Clock()
    failure = f"GET {URL} failed: no whole answer within 5s (timed out)"
    dispatcher = Dispatcher(failure, failure, REPORT, failure)
    pods = SnapshotReaders(fetch=dispatcher, seconds=clock)

    assert pods.read("team-a", URL) == failure and dispatcher.asked == 1
    clock.now += 4.5
    skipped = pods.read("team-a", URL)
    # Not asked: an unreadable answer like any other (fail closed), in the last failure's words (a status
    # that quotes it is not rewritten), with when it may be asked.
    assert isinstance(skipped, Unasked) and dispatcher.asked == 1
    assert skipped.retry_after == 0.5 and skipped == failure and not skipped.busy
    assert pods.read("team-a", OTHER) == failure and dispatcher.asked == 2  # another pod is its own
    clock.now += 0.5
    assert pods.read("team-a", URL) == REPORT and dispatcher.asked == 3  # asked again; a good answer
    assert pods.read("team-a", URL) == failure and dispatcher.asked == 4  # asked at once: it was reset
    clock.now += 1
    again = pods.read("team-a", URL)
    assert isinstance(again, Unasked) and again.retry_after == 4.0 and dispatcher.asked == 4


def test_a_deletion_goes_to_no_dispatcher_backed_off_for_its_reads_and_moves_no_back_off() -> None:
    clock = Clock()
    deleted: list[str] = []
    pods = SnapshotReaders(
        fetch=lambda url: "refused", delete=lambda url: deleted.append(url) or "timed out", seconds=clock
    )
    assert pods.remove("team-a", URL) == "timed out" and deleted == [URL]
    assert pods.remove("team-a", URL) == "timed out" and len(deleted) == 2  # a deletion backs nothing off
    assert pods.read("team-a", URL) == "refused"
    skipped = pods.remove("team-a", URL)
    assert isinstance(skipped, Unasked) and skipped.retry_after == 5.0 and len(deleted) == 2


def test_at_most_2_reads_of_one_namespace_run_at_once_and_a_third_is_not_waited_for() -> None:
    entered, release = threading.Semaphore(0), threading.Event()
    asked: list[str] = []

    def slow(url: str) -> SnapshotsReport | str:
        asked.append(url)
        entered.release()
        release.wait(30)  # a pod that drips: its read holds this thread until the test lets it go
        return REPORT

    clock = Clock()
    pods = SnapshotReaders(fetch=slow, seconds=clock)
    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            held = _reads_held(pods, pool, entered, asked, release)
        finally:
            release.set()
        assert [f.result(timeout=10) for f in held] == [REPORT] * 3
    assert pods.cap.under_way("team-a") == 0
    # Over the cap is not a failure of the pod: it is asked the next time, at once.
    assert pods.read("team-a", "http://10.0.0.11:8080/v1/snapshots") == REPORT


def _reads_held(
    pods: SnapshotReaders,
    pool: ThreadPoolExecutor,
    entered: threading.Semaphore,
    asked: list[str],
    release: threading.Event,
) -> list[Future[SnapshotsReport | str]]:
    """Two reads of team-a held by their pods, a third refused at once, one of team-b beside them."""
    held = [pool.submit(pods.read, "team-a", url) for url in (URL, OTHER)]
    for _ in held:
        assert entered.acquire(timeout=10), f"the two reads did not start: {asked}"
    assert pods.cap.under_way("team-a") == readers.READS_PER_NAMESPACE == 2
    third = pods.read("team-a", "http://10.0.0.11:8080/v1/snapshots")  # returns at once, on this thread
    assert isinstance(third, Unasked) and third.retry_after == readers.BUSY_RETRY_SECONDS and third.busy
    assert "2 reads of namespace team-a's pods were under way" in third and len(asked) == 2
    # Another namespace's pods are read meanwhile.
    held.append(pool.submit(pods.read, "team-b", "http://10.1.0.1:8080/v1/snapshots"))
    assert entered.acquire(timeout=10), f"team-b's read did not start beside team-a's: {asked}"
    assert not release.is_set()
    return held


def test_the_cap_frees_a_slot_when_a_read_raises() -> None:
    cap = NamespaceCap(most=1)
    try:
        with cap.slot("team-a") as free:
            assert free
            raise RuntimeError("a read that broke")
    except RuntimeError:
        pass
    with cap.slot("team-a") as free:
        assert free and cap.under_way("team-a") == 1
        with cap.slot("team-a") as second:
            assert not second and cap.under_way("team-a") == 1
    assert cap.under_way("team-a") == 0


def _dispatcher_pod(namespace: str, name: str, ip: str) -> dict[str, object]:
    return {
        "metadata": {"name": f"{name}-dispatcher-0", "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_the_background_server_info_reads_of_one_namespace_take_at_most_2_of_its_threads() -> None:
    """Slow dispatchers of team-a hold 2 of the 4 background threads; team-a's third waits for a slot
    (asked again in 2 s, not in 5 minutes), and team-b's dispatcher is read beside them."""
    entered, release = threading.Semaphore(0), threading.Event()
    asked: list[str] = []
    info = ServerInfo("2.16.2", "3.11.2", GraphDefVersions(producer=1766, min_consumer=0, min_producer=0))

    def slow(url: str) -> ServerInfo | None:
        asked.append(url)
        entered.release()
        release.wait(30)  # a dispatcher that drips its /serverinfo
        return info

    pods = readers.Readers(read_server_info=slow, clock=Clock())
    try:
        for name, ip in (("a1", "10.0.0.1"), ("a2", "10.0.0.2")):
            assert readers.server_info(pods, [_dispatcher_pod("team-a", name, ip)], None, 8080) == ({}, 2.0)
            assert entered.acquire(timeout=10), f"{name}'s read did not start: {asked}"
        third = readers.server_info(pods, [_dispatcher_pod("team-a", "a3", "10.0.0.3")], None, 8080)
        assert third == ({}, readers.BUSY_RETRY_SECONDS) and len(asked) == 2
        other = readers.server_info(pods, [_dispatcher_pod("team-b", "b1", "10.1.0.1")], None, 8080)
        assert other == ({}, 2.0)
        assert entered.acquire(timeout=10), f"team-b's read did not start beside team-a's: {asked}"
    finally:
        release.set()
    pods.server_info.wait()
    assert pods.server_info_cap.under_way("team-a") == 0
    again = readers.server_info(pods, [_dispatcher_pod("team-a", "a3", "10.0.0.3")], None, 8080)
    assert again == ({}, 2.0)  # started now that a slot is free
    pods.server_info.wait()
    found, _ = readers.server_info(pods, [_dispatcher_pod("team-a", "a3", "10.0.0.3")], None, 8080)
    assert found["server_info"] == info and asked[-1] == "http://10.0.0.3:8080/serverinfo"
