"""`make bench-snapshots`: the preprocessing time a distributed snapshot saves, with real TensorFlow servers.

No Kubernetes: one ``tfdata-server dispatcher`` (fault tolerant, its journal in a ``work_dir``, as
``spec.dispatcher.faultTolerantMode`` makes it; a snapshot needs that) and ``--workers`` (2)
``tfdata-server worker`` processes on 127.0.0.1, each heartbeating every ``--heartbeat-ms`` (1000; a
worker takes a new snapshot's stream and a new job's task on its next heartbeat). This process is
the trainer; it reaches the service through published settings passed as ``environ`` (as
tests/server/test_snapshots.py does) and uses the client helper: ``distribute()``, and
``client.snapshots``'s ``save``, ``wait`` and ``load``. Nothing is pinned: the workers' preprocessing
takes the machine's CPUs, as it would take a worker pod's.

The pipeline: ``range(--elements)``, each element an image of 256x256x3 drawn from its index
(``stateless_uniform``), resized up (bicubic), blurred (a 5x5 depthwise convolution) and resized back
``--repeats`` times, then a 64x64 image and the mean of a ``tf.signal.stft`` spectrum: about 48 KB
and a few milliseconds of CPU per repeat. The trainer batches what it reads by ``--batch``.

- save: ``save()`` of the pipeline to a new snapshot, until ``wait()`` says COMPLETED; the time runs
  from the call to the ``DONE`` file's time (the reading's ``finished_at``), so the 0.5 s poll is not
  in it. A one-time cost, measured in every round as the reads are. Beside it, the workers' part: to
  the last stream's ``DONE`` file (each worker writes its own; the dispatcher writes the snapshot's
  once the workers' heartbeats have told it that every stream is done);
- live: the pipeline read through the service (``distribute()``, the workers run it, DYNAMIC);
- load: ``load()``, ``Dataset.load`` of the round's snapshot in the trainer (the files just written,
  on this machine's disk: likely in its page cache; a bucket is slower);
- load distributed: ``load(distributed=True)``, the workers read the snapshot's chunks and send the
  elements (``--no-distributed-load`` leaves it out).

Each of ``--rounds`` (3) rounds runs every one of them once, live first in one round and last in
the next, so the noise of a shared machine falls on all; a read is timed from the iterator's
creation to its last element (for a read through the service: the job's creation and the heartbeats
before its first task, about a second, included). The ratio vs live is each round's rate over the
same round's live rate; the table shows medians (min-max). Every read is checked: each index read
exactly once, and the elements at ``--sample`` indices equal (to 1e-5) what the pipeline computes
in this process; every snapshot must hold ``--elements`` elements.

Writes .local/bench/snapshots-last.json (the previous run's kept as snapshots-previous.json).
``--quick``: 300 elements, one round. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import now_rfc3339
from bench_dataplane import cluster, keep, print_table, show, spread

from tfdata_operator.wire import discovery, serverinfo, signals

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

READS = ("live", "load", "load distributed")
SNAPSHOT = "preprocessed"  # each round's is preprocessed-<round>
TOLERANCE = 1e-5


def pipeline(elements: int, repeats: int, indices: Any = None) -> Any:
    """The CPU-heavy pipeline, of ``range(elements)`` or of exactly ``indices``; deterministic."""
    import numpy as np
    import tensorflow as tf

    blur = np.outer([1, 4, 6, 4, 1], [1, 4, 6, 4, 1]) / 256.0
    kernel = tf.constant(np.repeat(blur[:, :, None, None], 3, axis=2), tf.float32)

    def preprocess(index: Any) -> dict[str, Any]:
        image = tf.random.stateless_uniform([256, 256, 3], tf.stack([index, tf.constant(7, tf.int64)]))
        for _ in range(repeats):
            image = tf.image.resize(image, [384, 384], method="bicubic")
            image = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "SAME")[0]
            image = tf.image.resize(image, [256, 256], method="area")
        spectrum = tf.abs(tf.signal.stft(tf.reshape(tf.reduce_mean(image, -1), [-1]), 256, 128))
        return {
            "index": index,
            "image": tf.image.resize(image, [64, 64], method="area"),
            "spectrum": tf.reduce_mean(spectrum, 0),
        }

    source = (
        tf.data.Dataset.range(elements)
        if indices is None
        else tf.data.Dataset.from_tensor_slices(tf.constant(indices, tf.int64))
    )
    return source.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)


def read(dataset: Any, batch: int, sample: set[int]) -> dict[str, Any]:
    """Every element of ``dataset``, batched here: the time, the indices read, the sampled elements."""
    import numpy as np

    indices: list[Any] = []
    kept: dict[int, dict[str, Any]] = {}
    started = time.perf_counter()
    for element in dataset.batch(batch):
        index = element["index"].numpy()
        indices.append(index)
        for position in np.flatnonzero(np.isin(index, list(sample))):
            kept[int(index[position])] = {key: value[position].numpy() for key, value in element.items()}
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "indices": np.concatenate(indices) if indices else np.array([]), "kept": kept}


def verify(label: str, got: dict[str, Any], elements: int, reference: dict[int, dict[str, Any]]) -> float:
    """Exits unless every index was read once and the sampled elements are the in-process ones;
    returns the largest difference seen."""
    import numpy as np

    indices = np.sort(got["indices"])
    if len(indices) != elements or not np.array_equal(indices, np.arange(elements)):
        unique, counts = np.unique(indices, return_counts=True)
        missing = np.setdiff1d(np.arange(elements), unique)
        raise SystemExit(
            f"{label}: read {len(indices)} elements, not each of {elements} once "
            f"(read twice or more: {unique[counts > 1][:10].tolist()}, missing: {missing[:10].tolist()})"
        )
    largest = 0.0
    for index, expected in reference.items():
        for key, value in expected.items():
            difference = float(np.max(np.abs(got["kept"][index][key] - value)))
            if not difference <= TOLERANCE:
                raise SystemExit(f"{label}: element {index}'s {key} differs from the in-process one by {difference}")
            largest = max(largest, difference)
    return largest


def environ(address: str, health_port: int, snapshot_dir: str) -> dict[str, str]:
    """The settings the operator publishes for a DYNAMIC service with ``spec.snapshots``."""
    health = f"http://127.0.0.1:{health_port}"
    return discovery.to_data(
        discovery.ClientSettings(
            address=f"grpc://{address}",
            sharding_policy="DYNAMIC",
            processing_mode="DYNAMIC",
            service_name="bench",
            report_url=health + signals.REPORT_PATH,
            server_info_url=health + serverinfo.INFO_PATH,
            snapshot_dir=snapshot_dir,
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1500, help="elements of the pipeline")
    parser.add_argument("--repeats", type=int, default=10, help="resize-blur-resize passes per element (its CPU)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--heartbeat-ms", type=int, default=1000, help="the workers' heartbeat interval")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each reading every way once, rotated")
    parser.add_argument("--batch", type=int, default=32, help="the trainer's batch")
    parser.add_argument("--sample", type=int, default=8, help="elements compared with the in-process pipeline")
    parser.add_argument("--no-distributed-load", action="store_true", help="leave out load(distributed=True)")
    parser.add_argument("--quick", action="store_true", help="300 elements, one round, for development")
    args = parser.parse_args()
    if args.quick:
        args.elements, args.rounds = 300, 1
    reads = [r for r in READS if not (args.no_distributed_load and r == "load distributed")]

    import numpy as np
    import tensorflow as tf

    from tfdata_operator import client
    from tfdata_operator.client import snapshots

    started = time.monotonic()
    results: dict[str, Any] = {
        "when": now_rfc3339(), "cpus": os.cpu_count(), "load average at start": os.getloadavg(),
        "args": vars(args), "tensorflow": tf.__version__,
    }  # fmt: skip
    sample = sorted({int(i) for i in np.linspace(0, args.elements - 1, args.sample)})
    reference = {
        int(e["index"]): {k: v.numpy() for k, v in e.items()} for e in pipeline(0, args.repeats, sample)
    }  # in this process, before the servers start: the values every read is checked against
    print(
        f"{args.elements} elements of {sum(v.nbytes for v in reference[0].values()):,} B, {args.repeats} repeats; "
        f"{args.workers} workers; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-snapshots-")))
        (tmp / "data").mkdir()
        service = stack.enter_context(
            cluster(
                args.workers, None, "DYNAMIC",
                dispatcher_options={"work_dir": str(tmp / "journal"), "fault_tolerant_mode": True},
                worker_options={"heartbeat_interval_ms": args.heartbeat_ms},
            )
        )  # fmt: skip
        service.wait_ready(300)
        env = environ(service.address, service.processes[0][1], str(tmp / "data"))
        print(f"dispatcher and {args.workers} workers ready after {time.monotonic() - started:.0f}s", flush=True)

        def save(name: str) -> dict[str, Any]:
            began = time.time()
            path = snapshots.save(pipeline(args.elements, args.repeats), name, environ=env)
            accepted = time.time() - began
            done = snapshots.wait(name, environ=env, timeout=1800, poll_seconds=0.5)
            assert done.finished_at is not None
            if done.elements != args.elements:
                raise SystemExit(f"the snapshot holds {done.elements} elements, not {args.elements}: {done.describe()}")
            # Each worker writes its stream's DONE file; the dispatcher writes the snapshot's once it hears of all.
            streams = max(p.stat().st_mtime for p in Path(path).glob("streams/stream_*/DONE"))
            return {"seconds": round(done.finished_at - began, 2), "streams written after seconds": round(
                    streams - began, 2), "accepted after seconds": round(accepted, 2), "bytes": done.bytes,
                    "chunks": done.chunks, "streams": done.streams_total}  # fmt: skip

        seconds: dict[str, list[float]] = {r: [] for r in ["save", "streams written", *reads]}
        saves: list[dict[str, Any]] = []
        largest = 0.0
        for round_ in range(args.rounds):
            # The save comes before the loads, which read this round's snapshot; live before or after them.
            loads = [r for r in reads if r != "live"]
            order = ["live", "save", *loads] if round_ % 2 == 0 else ["save", *reversed(loads), "live"]
            name = f"{SNAPSHOT}-{round_ + 1}"
            for how in order:
                if how == "save":
                    saves.append(save(name))
                    took = saves[-1]["seconds"]
                    seconds["streams written"].append(saves[-1]["streams written after seconds"])
                else:
                    if how == "live":
                        dataset = pipeline(args.elements, args.repeats).apply(client.distribute(environ=env))
                    else:
                        dataset = snapshots.load(name, environ=env, distributed=how == "load distributed")
                    got = read(dataset, args.batch, set(sample))
                    largest = max(largest, verify(how, got, args.elements, reference))
                    took = got["seconds"]
                seconds[how].append(took)
                print(f"  round {round_ + 1}/{args.rounds}: {how}: {took:.2f}s, {args.elements / took:,.0f}/s"
                      + (f" (streams written after {saves[-1]['streams written after seconds']:.2f}s)"
                         if how == "save" else ""), flush=True)  # fmt: skip

    live = seconds["live"]
    results["snapshots"] = saves
    results["runs"] = {
        how: {
            "seconds": spread(values, 2),
            "elements/s": spread([args.elements / s for s in values], 1),
            "vs live": spread([lv / s for lv, s in zip(live, values, strict=True)], 2),
            "each round, seconds": [round(s, 2) for s in values],
        }
        for how, values in seconds.items()
    }
    results["largest difference from in process"] = largest
    saved = statistics.median(live) - statistics.median(seconds["load"])
    results["seconds saved per load (live - load)"] = round(saved, 2)
    # The save costs this many loads' savings: after that many loads, save + loads beat live reads.
    results["loads to repay the save"] = round(statistics.median(seconds["save"]) / saved, 2) if saved > 0 else None
    results["load average at end"] = os.getloadavg()
    results["seconds"] = round(time.monotonic() - started)

    titles = {
        "save": f"save: distributed_save on {args.workers} workers, to COMPLETED",
        "streams written": "  the workers' part: to each stream's DONE",
        "live": f"live: the pipeline on {args.workers} workers, through the service",
        "load": "load: Dataset.load of the snapshot, in the trainer",
        "load distributed": "load(distributed=True): the workers read the snapshot",
    }
    rows = [
        [titles[how], f"{args.elements:,}", show(figures["seconds"], 2), show(figures["elements/s"]),
         show(figures["vs live"], 2)]
        for how, figures in results["runs"].items()
    ]  # fmt: skip
    print_table(
        f"Preprocessing saved by a snapshot: {args.elements:,} elements, {args.rounds} rounds, median (min-max); "
        f"snapshot {statistics.median(s['bytes'] for s in saves) / 1e6:,.0f} MB",
        ["pipeline", "elements", "seconds", "elements/s", "vs live"],
        rows,
    )
    print(
        f"\neach load of the snapshot saves {saved:.1f}s of preprocessing; the save costs "
        f"{results['loads to repay the save']} loads' worth. Every read: each index once, sampled elements within "
        f"{largest:.1g} of the in-process ones."
    )
    print(f"\n{results['seconds']} s; written to {keep(results, 'snapshots')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
