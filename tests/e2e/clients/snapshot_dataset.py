"""A trainer that saves a dataset to a tf.data snapshot through a service, or loads one back, with the
client helper (``tfdata_operator.client.snapshots``) and the service's published settings in its
environment (what ``envFrom`` of the ``<service>-client`` ConfigMap gives a trainer pod):

    python snapshot_dataset.py save NAME SERVICE --elements 600 --sleep-us 100000
    python snapshot_dataset.py load NAME SERVICE

The dataset is ``(i, i*i + 7)`` for i in range(elements), slowed down on the workers by
``sleep-us`` per element. ``save`` prints "saved <path>" once the dispatcher took it; ``load``
waits for the snapshot to complete (at most --timeout seconds), then prints one line per element
("element i,v") and "loaded <count>". An error is printed as
"error <type>: <message>" (exit code 2).
"""

from __future__ import annotations

import argparse
import sys


def dataset(elements: int, sleep_us: int):  # type: ignore[no-untyped-def]
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    pipeline = tf.data.Dataset.range(elements).map(lambda x: (x, x * x + 7))
    return pipeline.apply(testing.sleep(sleep_us)) if sleep_us else pipeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=("save", "load"))
    parser.add_argument("name")
    parser.add_argument("service")
    parser.add_argument("--elements", type=int, default=600)
    parser.add_argument("--sleep-us", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()

    from tfdata_operator.client import snapshots

    try:
        if args.action == "save":
            path = snapshots.save(dataset(args.elements, args.sleep_us), args.name, args.service)
            print(f"saved {path}", flush=True)
            return 0
        snapshots.wait(args.name, args.service, timeout=args.timeout)
        count = 0
        for index, value in snapshots.load(args.name, args.service).as_numpy_iterator():
            print(f"element {int(index)},{int(value)}", flush=True)
            count += 1
        print(f"loaded {count}", flush=True)
        return 0
    except Exception as exc:  # the test reads what went wrong from stdout
        print(f"error {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
