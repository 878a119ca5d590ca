"""A Keras trainer for tests/e2e/test_trainer.py: ``model.fit`` on an I/O-bound service, with ``StallCallback``.

    python fit_dataset.py SERVICE --stop-file PATH [--sleep-ms 100] [--timeout 150] [--job-name NAME]

Reads through ``tfdata_operator.client.distribute(SERVICE)`` (the settings from the environment the
service's ConfigMap gives with ``envFrom``; ``--job-name``: a job shared with the trainers that give the
same name); each batch waits ``--sleep-ms`` in the workers, as a
read from a bucket does, and costs them almost no CPU. The fit's one addition for reporting is
``callbacks=[StallCallback()]``. It prints ``fit started``, trains until PATH exists (or
``--timeout`` seconds), then prints one JSON line, ``summary {...}``: the seconds, and what the
callback measured (elements, stall fraction, where it reported), and the helper's file.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("service")
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--sleep-ms", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--job-name", default=None)
    args = parser.parse_args()

    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    from tfdata_operator import client

    dataset = tf.data.Dataset.range(10**6).map(lambda i: (tf.fill([8], tf.cast(i % 7, tf.float32)), i % 3)).batch(4)
    dataset = dataset.apply(testing.sleep(args.sleep_ms * 1000)).apply(
        client.distribute(args.service, job_name=args.job_name)
    )
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    began = time.monotonic()

    class Until(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs: object = None) -> None:
            print("fit started", flush=True)

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if os.path.exists(args.stop_file) or time.monotonic() - began > args.timeout:
                self.model.stop_training = True

    stall = client.StallCallback()
    model.fit(dataset, steps_per_epoch=10**6, epochs=1, verbose=0, callbacks=[Until(), stall])
    seconds = time.monotonic() - began
    reporter = stall.reporter
    assert reporter is not None
    summary = {
        "seconds": round(seconds, 1),
        "elements": reporter.total_elements,
        "stall_fraction": round(reporter.stall_fraction, 3),
        "report_url": reporter.report_url,
        "helper": client.__file__,  # which checkout's client helper ran
    }
    print("summary " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
