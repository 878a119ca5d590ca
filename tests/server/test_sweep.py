"""Trials of a sweep share one preprocessing through the workers' cross-trainer cache (issue 40.2).

A real dispatcher and a real ``tfdata-server`` worker, whose configuration carries
``cross_trainer_cache_size_bytes`` as the operator renders it from ``spec.workers.crossTrainerCacheSize``;
trials read one shared job with the client helper's ``distribute(..., trial=k)``. The pipeline's map
writes a file named after its element and a random number each time it runs, so the files count how
often the worker computed each element.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator import client
from tfdata_operator.wire.serverconfig import DispatcherServerConfig

from fixtures.servers import Launch, ServerProcess, free_port, worker_config

CACHE_BYTES = 4 * 2**20  # spec.workers.crossTrainerCacheSize: 4Mi
VALUES = 2048  # float32 each: an element of 8 KiB (sent uncompressed), so the cache holds about 500
TRIALS, READ = 3, 200
AHEAD = 2_000  # how far one trial reads before a late one starts: four times what the cache holds
READ_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def service(module_launch: Launch) -> tuple[str, ServerProcess]:
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None
    port = free_port()
    dispatcher = module_launch(DispatcherServerConfig(port=port, health_port=free_port()), env=env)
    config = dataclasses.replace(worker_config(port), cross_trainer_cache_size_bytes=CACHE_BYTES)
    worker = module_launch(config, pod_name="127.0.0.1", env=env)
    for process in (dispatcher, worker):
        process.wait_probe("/readyz", 200)
    return f"grpc://127.0.0.1:{port}", dispatcher


def pipeline(computed: Path) -> Any:
    """An endless stream 0, 1, 2, ...; each time the worker computes element x it writes ``x-<random>``."""
    import tensorflow as tf

    def compute(x: Any) -> Any:
        nonce = tf.random.uniform([], 0, 2**62, dtype=tf.int64)
        name = tf.strings.join([str(computed), "/", tf.strings.as_string(x), "-", tf.strings.as_string(nonce)])
        tf.io.write_file(name, "")
        return x, tf.fill([VALUES], tf.cast(x, tf.float32))

    return tf.data.Dataset.range(10**9).repeat().map(compute)


def read_as_trial(service: tuple[str, ServerProcess], computed: Path, trial: int, count: int) -> list[int]:
    address, dispatcher = service
    read = pipeline(computed).apply(
        client.distribute(
            address=address,
            sharding_policy="DYNAMIC",
            job_name="sweep",
            trial=trial,
            server_info_url=f"http://127.0.0.1:{dispatcher.config.health_port}/serverinfo",
            compression=None,
        )
    )
    seen = []
    for x, values in read.take(count):
        assert float(values[0]) == float(x)  # the element itself, not another's
        seen.append(int(x))
    return seen


def test_three_trials_read_the_whole_stream_and_the_worker_computes_each_element_once(
    service: tuple[str, ServerProcess], tmp_path: Path
) -> None:
    computed = tmp_path / "computed"
    computed.mkdir()
    results: dict[int, list[int]] = {}
    failures: list[BaseException] = []

    def trial(k: int) -> None:
        try:
            results[k] = read_as_trial(service, computed, k, READ)
        except BaseException as exc:  # reported below, with the worker's log
            failures.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=trial, args=(k,), daemon=True) for k in range(TRIALS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(READ_TIMEOUT)
    alive = [k for k, thread in enumerate(threads) if thread.is_alive()]
    assert not alive and not failures, (alive, failures, sorted(results), service[1].log()[-3000:])
    print(f"{TRIALS} trials read {READ} elements each in {time.monotonic() - started:.1f}s")

    for k in range(TRIALS):
        assert results[k] == list(range(READ)), (k, results[k][:20])
    times = Counter(name.split("-")[0] for name in os.listdir(computed))
    assert times, "the worker computed nothing"
    twice = {x: n for x, n in times.items() if n > 1}
    assert not twice, f"computed more than once: {dict(list(twice.items())[:10])}"
    assert {str(x) for x in range(READ)} <= set(times)
    print(f"the worker computed {len(times)} elements, each once, for {TRIALS * READ} reads")

    # The cache is a window of CACHE_BYTES: a trial that starts after another has read far ahead
    # begins at the window's start, not at 0 (with TensorFlow's default of 10 GiB it would begin at 0).
    ahead = read_as_trial(service, computed, TRIALS, AHEAD)
    assert ahead[:READ] == list(range(READ)) and len(ahead) == AHEAD
    late = read_as_trial(service, computed, TRIALS + 1, 1)
    assert late[0] > READ, f"the late trial began at element {late[0]}: the {CACHE_BYTES}-byte cache held more"
    print(f"a trial started {AHEAD} elements behind began at element {late[0]}")
    again = Counter(name.split("-")[0] for name in os.listdir(computed))
    assert max(again.values()) == 1, "an element was computed twice"
