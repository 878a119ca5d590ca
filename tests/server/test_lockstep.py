"""Many trainers of one synchronous job read one service in lockstep (issue 40.1).

Two trainer processes, each with the TF_CONFIG of a 2-worker MultiWorkerMirroredStrategy cluster on
127.0.0.1, train a tiny model in a custom loop over ``distribute_datasets_from_function`` and the helper's
dataset (``lockstep_trainer.py``), from a real dispatcher and two workers (``client_cluster.py``).
The same two trainers in tf-keras's ``model.fit`` (Keras 3's fails under MultiWorkerMirroredStrategy
whatever the dataset, keras-team/keras#20585; docs/trainers.md).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_trainer_client import TRAINER_TIMEOUT, Cluster, result_of, start_trainer

from fixtures.support import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi-worker"
N, BATCH, EPOCHS = 256, 16, 2  # one epoch = one pass: 256 // (16 * 2 trainers) = 8 steps


@pytest.fixture(scope="module", params=["DYNAMIC", "DATA"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A dynamic policy, and a static one (each worker reads its fixed half, round after round)."""
    started = Cluster(request.param, 2, tmp_path_factory.mktemp("lockstep") / "cluster.log")
    yield started
    started.stop()


def tf_configs(trainers: int = 2) -> list[dict[str, Any]]:
    workers = [f"127.0.0.1:{free_port()}" for _ in range(trainers)]
    return [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}} for i in range(trainers)]


def train(
    cluster: Cluster,
    way: str,
    job_name: str,
    linger: dict[int, float] | None = None,
    slow_us: int = 0,
    sizes: tuple[int, int, int] = (N, BATCH, EPOCHS),
) -> list[dict[str, Any]]:
    """Both trainers, started together; each must finish within the trainer timeout (no hang). ``linger``:
    seconds a trainer (by index) stays in ``model.fit`` after its last step; ``slow_us``: the workers'
    sleep before each element; ``sizes``: elements per pass, batch per trainer, epochs."""
    n, batch, epochs = sizes
    started = time.monotonic()
    trainers = [
        start_trainer(
            script="lockstep_trainer.py",
            address=cluster.address,
            policy=cluster.policy,
            job_name=job_name,
            tf_config=config,
            n=n,
            batch=batch,
            epochs=epochs,
            way=way,
            linger=(linger or {}).get(i, 0),
            slow_us=slow_us,
        )
        for i, config in enumerate(tf_configs())
    ]
    results = [result_of(trainer) for trainer in trainers]
    print(f"{way}: both trainers done in {time.monotonic() - started:.1f}s")
    for result in results:
        assert "error" not in result, result
    return results


def test_two_trainers_in_a_custom_loop_get_equal_full_batches_and_every_element(cluster: Cluster) -> None:
    assert_lockstep(train(cluster, "loop", "lockstep-loop"))


@pytest.mark.parametrize("cluster", ["DYNAMIC"], indirect=True)
def test_two_trainers_in_keras_fit_stay_in_step_and_read_every_element(cluster: Cluster) -> None:
    """tf-keras's ``model.fit`` (TF_USE_LEGACY_KERAS=1) on each trainer's batches from
    ``distribute_datasets_from_function``, 2 epochs of ``steps_per_epoch``: the same checks as the custom
    loop, and one model."""
    results = train(cluster, "fit", "lockstep-fit")
    assert_lockstep(results)
    # MultiWorkerMirroredStrategy sums the gradients of both trainers' batches: after every step both
    # hold the same weights and report the same loss, and the model did learn (it moved from where it started).
    assert results[0]["losses"] == pytest.approx(results[1]["losses"]), [r["losses"] for r in results]
    assert results[0]["epochs"] == pytest.approx(results[1]["epochs"]), [r["epochs"] for r in results]
    a, b = (result["weights"] for result in results)
    assert len(a) == len(b) == EPOCHS * results[0]["steps_per_epoch"]
    for step, (wa, wb) in enumerate(zip(a, b, strict=True)):
        assert wa == pytest.approx(wb, abs=1e-6), f"step {step}: trainer 0 has {wa}, trainer 1 {wb}"
    assert a[0] != a[-1], a
    assert len(results[0]["epochs"]) == EPOCHS


@pytest.mark.parametrize("cluster", ["DYNAMIC"], indirect=True)
def test_a_trainer_still_in_fit_after_the_other_has_gone_ends_too(cluster: Cluster) -> None:
    """Trainer 0 stays in ``model.fit`` for 5 s after its last step, its input still alive, while trainer 1
    lets go of its own and exits; the workers are slow, so neither trainer's input is far ahead of its
    steps. TensorFlow's distributed iterator, let go of, waits for the batch it was prefetching; in
    lockstep that batch needs rounds trainer 1 no longer asks for, so a trainer whose batches went on past
    the training waited there forever (issue 40). Ended with the training, trainer 0's input has nothing
    left to wait for: both finish, every element read as in the other cases."""
    sizes = (1024, 64, 2)  # batches far larger than what the read fetches ahead of them: 2 epochs of 8 steps
    results = train(cluster, "fit", "lockstep-linger", linger={0: 5.0}, slow_us=5_000, sizes=sizes)
    assert_lockstep(results, sizes)


@pytest.mark.parametrize("cluster", ["DYNAMIC"], indirect=True)
def test_the_multi_worker_example_trains_one_model_in_two_trainers(cluster: Cluster) -> None:
    """examples/multi-worker/'s entry.py and train.py, run as its indexed Job runs them (the environment
    trainers.yaml sets, JOB_COMPLETION_INDEX 0 and 1), with the trainers on 127.0.0.1 and the address
    given: both finish every epoch and end with one model."""
    base = two_free_ports()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "NUM_TRAINERS": "2", "TF_USE_LEGACY_KERAS": "1",
           "TRAINER_ADDRESS": f"127.0.0.1:{base}{{index}}"}  # fmt: skip
    command = [sys.executable, str(EXAMPLE / "entry.py"), "--job-name", "example", "--address", cluster.address,
               "--elements", "1024", "--batch", "16", "--epochs", "2"]  # fmt: skip
    trainers = [
        subprocess.Popen(
            command,
            env={**env, "JOB_COMPLETION_INDEX": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    ends = []
    for i, trainer in enumerate(trainers):
        try:
            out, _ = trainer.communicate(timeout=TRAINER_TIMEOUT)
        except subprocess.TimeoutExpired:
            for t in trainers:
                t.kill()
            pytest.fail(f"trainer {i} still running after {TRAINER_TIMEOUT:.0f}s:\n{trainer.communicate()[0][-3000:]}")
        assert trainer.returncode == 0, f"trainer {i} exited {trainer.returncode}:\n{out[-3000:]}"
        assert f'"task": {{"type": "worker", "index": {i}}}' in out, out[-3000:]
        (end,) = re.findall(r"^trainer (\d) of 2: 2 epochs of 32 steps, losses \[(.*)\], weights (.*)$", out, re.M)
        ends.append(end)
    assert [end[0] for end in ends] == ["0", "1"]
    assert ends[0][1:] == ends[1][1:], f"the trainers ended apart: {ends}"
    losses = [float(loss) for loss in ends[0][1].split(", ")]
    assert losses[1] < losses[0], f"the model did not learn: losses {losses}"


def two_free_ports() -> int:
    """A prefix p such that ports p0 and p1 are free: TRAINER_ADDRESS's {index} ends the port."""
    for _ in range(50):
        base = free_port() // 10
        if base * 10 + 1 > 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base * 10))
                b.bind(("127.0.0.1", base * 10 + 1))
        except OSError:
            continue
        return base
    raise AssertionError("no two free ports in a row on 127.0.0.1")


def assert_lockstep(results: list[dict[str, Any]], sizes: tuple[int, int, int] = (N, BATCH, EPOCHS)) -> None:
    """Each step every trainer got a full batch of its own elements, and two epochs read two passes' worth."""
    n, batch, epochs = sizes
    # The helper read each trainer's place from TF_CONFIG (under tf-keras too): coordinated reads of 2
    # consumers. (The element checks below also hold first-come-first-served on an endless dataset.)
    assert [result["coordinated"] for result in results] == [[0, 2], [1, 2]]
    steps = n // (batch * 2)
    for i, result in enumerate(results):
        sizes = [len(batch) for batch in result["steps"]]
        assert result["steps_per_epoch"] == steps
        assert sizes == [batch] * (epochs * steps), f"trainer {i}'s batch sizes per step: {sizes}"
    # Each round gives every trainer its own elements: no step's batches share one.
    for step, (a, b) in enumerate(zip(results[0]["steps"], results[1]["steps"], strict=True)):
        assert not set(a) & set(b), f"step {step}: both trainers got {sorted(set(a) & set(b))}"
    # DYNAMIC hands every element of a pass out once; DATA has each worker repeat its own half, and the
    # rounds take from the workers in turn. Either way two epochs read two passes' worth: every element
    # was read, and none more often than the passes the workers had begun (at most one ahead).
    counts = Counter(i for result in results for batch in result["steps"] for i in batch)
    assert sum(counts.values()) == epochs * n
    missing = sorted(set(range(n)) - set(counts))
    assert not missing, f"never read in {epochs} passes' worth: {missing[:20]} ({len(missing)})"
    too_often = {i: c for i, c in counts.items() if c > epochs + 1}
    assert not too_often, f"read more often than the passes begun: {too_often}"
    for result in results:
        assert all(loss == loss for loss in result["epochs"]), result["epochs"]  # not NaN


def test_a_finite_dataset_is_refused_with_what_to_use_before_anything_is_sent() -> None:
    config = tf_configs()[1]
    never = "grpc://127.0.0.1:1"  # nothing listens: the refusal comes before any request
    trainer = start_trainer(script="lockstep_trainer.py", address=never, policy="DYNAMIC", job_name="never",
                            tf_config=config, n=N, batch=BATCH, epochs=1, way="refuse")  # fmt: skip
    result = result_of(trainer)
    assert result["error"] == "LockstepError", json.dumps(result)
    message = result["message"]
    assert "2 trainers in lockstep (trainer 1, from TF_CONFIG)" in message
    assert f"ends after {N} element(s)" in message and ".repeat()" in message and "steps_per_epoch" in message
