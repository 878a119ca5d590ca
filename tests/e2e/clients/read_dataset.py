"""A real tf.data client for the end-to-end tests and the demo: reads TFRecord files through a service.

    python read_dataset.py --service grpc://x-dispatcher.ns.svc.cluster.local:5050 \
        --files '/data/*.tfrecord' --mode DYNAMIC [--hint] [--job-name j] [--timeout 120]

or, as a trainer in a pod that takes the service's published settings with `envFrom`, through the
client helper (`tfdata_operator.client.distribute("x")`: no address, the mode is the service's):

    python read_dataset.py --discover x --files '/data/*.tfrecord' [--map upper] [--job-name j]

Prints "iterating" just before its first next(), one line per element as it arrives ("element
<value>"), one when a read of the whole dataset ends ("read <n>"; --until-file reads it again, each
time as a new job, until that file exists), then a JSON summary line ("summary {...}": the elements,
the reads, the seconds from "iterating" to the end and, when any came, to the first and the last
element), or
"error <type>: <message>" (exit code 2).
With --discover it first prints the TFDATA_* variables it was given ("settings {...}") and its pipeline's fingerprint
("fingerprint <digest>"), then "ready" once it has joined the job. A watchdog ends the process
with exit code 3 if the whole read takes longer than --timeout, so a test never hangs on a
client that waits forever.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

MODES = ("OFF", "DYNAMIC", "FILE", "DATA", "FILE_OR_DATA", "HINT")
# Transformations two trainers may differ by (--map): the seed's case of one job, two map functions.
MAPS = ("upper", "suffix", "length")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--service", help="the dispatcher's address (TensorFlow's own distribute)")
    parser.add_argument("--discover", metavar="NAME", help="the client helper with the settings published for NAME")
    parser.add_argument("--files", required=True, help="glob of TFRecord files")
    parser.add_argument("--mode", choices=MODES, help="needed with --service; with --discover, passed on if given")
    parser.add_argument("--map", choices=MAPS, help="a transformation of each record")
    parser.add_argument("--start-when", metavar="PATH", help="with --discover: after 'ready', wait for PATH to exist")
    parser.add_argument("--hint", action="store_true", help="shard(SHARD_HINT, SHARD_HINT) after listing files")
    parser.add_argument("--job-name", default=None)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to sleep per element (slow reader)")
    parser.add_argument("--repeat", type=int, default=1, help="read the files this many times (one job)")
    parser.add_argument("--burn", type=int, default=0, help="256x256 matmuls per element in the workers (CPU load)")
    parser.add_argument(
        "--sleep-ms", type=int, default=0,
        help="each element waits this long in the workers, using no CPU (a read from a bucket or a network filesystem)",
    )  # fmt: skip
    parser.add_argument(
        "--report", metavar="URL", default=None,
        help="with --service: read through the client helper's iterate(), reporting data stalls to URL",
    )  # fmt: skip
    parser.add_argument(
        "--until-file", default=None,
        help="read everything again, each time as a new job, until this file exists; then end after the current read",
    )  # fmt: skip
    args = parser.parse_args()
    if (args.service is None) == (args.discover is None) or (args.service and not args.mode):
        parser.error("give either --service and --mode, or --discover")

    def watchdog() -> None:
        time.sleep(args.timeout)
        print(f"error timed out after {args.timeout:.0f}s", flush=True)
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()

    import tensorflow as tf

    files = tf.data.Dataset.list_files(args.files, shuffle=False)
    if args.hint:
        files = files.shard(tf.data.experimental.SHARD_HINT, tf.data.experimental.SHARD_HINT)
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=1).repeat(args.repeat)
    if args.burn:
        matrix = tf.random.stateless_uniform([256, 256], seed=[1, 2]) / 256.0

        def burn(element: tf.Tensor) -> tf.Tensor:
            # Products that start from the element and decide what is returned, so that TensorFlow's
            # graph optimizer can neither fold them into a constant nor prune them.
            start = matrix + tf.cast(tf.strings.length(element), tf.float32) * 1e-9
            _, product = tf.while_loop(
                lambda i, m: i < args.burn, lambda i, m: (i + 1, tf.matmul(m, matrix)), [0, start]
            )
            return tf.cond(tf.reduce_sum(product) > -1e30, lambda: element, lambda: element + b"!")

        dataset = dataset.map(burn)
        # One thread per element, as a real per-element preprocessing step: a worker's share of the
        # CPU then grows with the elements it works on at once, not with TensorFlow's thread pools,
        # and more workers read faster on a 2-core machine too.
        options = tf.data.Options()
        options.threading.max_intra_op_parallelism = 1
        dataset = dataset.with_options(options)
    if args.sleep_ms:
        # TensorFlow's own SleepDataset (not exported as tf.data.experimental.sleep): a graph op, so it
        # runs in the workers, where a py_function cannot.
        from tensorflow.python.data.experimental.ops import testing

        dataset = dataset.apply(testing.sleep(args.sleep_ms * 1000))
    if args.map:
        dataset = dataset.map(
            {"upper": tf.strings.upper, "suffix": lambda r: r + "!", "length": tf.strings.length}[args.map]
        )
    start = time.monotonic()
    count = reads = 0
    first = last = None  # seconds from start to the first and to the last element
    try:
        if args.discover:
            elements = through_client(args, dataset)
        else:
            policy = getattr(tf.data.experimental.service.ShardingPolicy, args.mode)
            elements = dataset.apply(
                tf.data.experimental.service.distribute(
                    processing_mode=policy, service=args.service, job_name=args.job_name
                )
            )
        stream = passes(elements, args.until_file)
        if args.report:
            from tfdata_operator import client

            # One meter over every pass: one reporting client for the whole run, as a trainer's epochs.
            stream = client.iterate(stream, report_url=args.report, interval=5.0)
        print("iterating", flush=True)  # the first next() follows
        for element in stream:
            if element is None:
                reads += 1
                print(f"read {reads}", flush=True)
                continue
            value = element.numpy()
            print(f"element {value.decode() if isinstance(value, bytes) else value}", flush=True)
            count += 1
            last = time.monotonic() - start
            first = last if first is None else first
            if args.delay:
                time.sleep(args.delay)
    except Exception as exc:  # the test asserts on this message
        print(f"error {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        return 2
    seconds = time.monotonic() - start
    figures = {"elements": count, "reads": reads, "seconds": round(seconds, 3)}
    if first is not None and last is not None:
        figures.update(first_element=round(first, 3), last_element=round(last, 3))
    print("summary " + json.dumps(figures), flush=True)
    return 0


def passes(elements: Iterable[Any], until_file: str | None) -> Iterator[Any]:
    """Every element of one pass, then None; again while ``until_file`` does not exist.

    Each pass over a distributed dataset is a job of its own (an anonymous one, or again
    --job-name's once the last ended), read in full.
    """
    while True:
        yield from elements
        yield None
        if until_file is None or os.path.exists(until_file):
            return


def through_client(args: argparse.Namespace, dataset: Any) -> Iterable[Any]:
    """Reads as a trainer does with the client helper: every setting from the environment."""
    from tfdata_operator import client

    given = {k: v for k, v in os.environ.items() if k.startswith("TFDATA_")}
    print("settings " + json.dumps(given, sort_keys=True), flush=True)
    print(f"fingerprint {client.dataset_fingerprint(dataset).digest}", flush=True)
    dataset = dataset.apply(client.distribute(args.discover, processing_mode=args.mode, job_name=args.job_name))
    print("ready", flush=True)
    if args.start_when:
        while not os.path.exists(args.start_when):  # the watchdog bounds this wait
            time.sleep(0.1)
    return client.iterate(dataset)


if __name__ == "__main__":
    sys.exit(main())
