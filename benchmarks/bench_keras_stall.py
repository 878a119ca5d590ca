#!/usr/bin/env python3
"""What reporting a Keras fit's data stall costs: steps/s of ``model.fit`` with each way to do it.

A benchmark, not a test (issue 24 §2): it prints a table and asserts nothing. One small model
(32 -> ``--hidden`` -> 10, batches of ``--batch``; by default a step of under a millisecond, so
any per-step cost shows) on an in-process dataset, fitted in rounds; each round runs every option
once, in a rotated order, as a fresh model after a warm-up fit (so tracing is not timed). Besides
steps/s it prints the process's CPU time per step, which the scheduling noise of a shared machine
moves less. The options:

- ``plain``: ``model.fit(ds)``, the baseline;
- ``stage``: ``model.fit(stamp_waits(ds))``, the stage ``distribute()`` ends with, and no
  callback (what every ``distribute()`` user pays): two maps run inline on the asking thread that
  add to two ``tf.Variable`` counters;
- ``py_function``: the stage as it first was, for comparison: the same zip and maps run by
  ``map`` (on the inter-op thread pool), handing each wait to Python with a ``tf.py_function``;
- ``callback``: the same with ``callbacks=[StallCallback(report_url=...)]`` reporting to a
  local receiver (the chosen way);
- ``iterate``: ``model.fit(b for b in iterate(ds, report_url=...))``: ``iterate``'s meter as a
  Python generator, which Keras reads through ``tf.data.Dataset.from_generator``.

Usage::

    PYTHONPATH=operator/src .venv/bin/python benchmarks/bench_keras_stall.py [--rounds 7] [--steps 1500] \
        [--hidden 64] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OPTIONS = ("plain", "stage", "py_function", "callback", "iterate")


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def py_function_stage(dataset: Any) -> Any:
    """The first ``stamp_waits``: a Python call per element (what ``stage`` replaced)."""
    import tensorflow as tf

    asked = tf.data.Dataset.from_tensors(tf.constant(0, tf.int8)).repeat().map(lambda _: tf.timestamp())

    def arrived(asked_at: Any, element: Any) -> Any:
        tf.py_function(lambda waited: waited, [tf.timestamp() - asked_at], tf.float64)
        return element

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return tf.data.Dataset.zip((asked, dataset)).map(arrived).with_options(options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    import tensorflow as tf

    from tfdata_operator import client
    from tfdata_operator.client import fit

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/client-report"

    x = tf.random.normal((4096, 32))
    y = tf.random.uniform((4096,), 0, 10, tf.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).repeat()

    def model() -> Any:
        m = tf.keras.Sequential(
            [tf.keras.Input((32,)), tf.keras.layers.Dense(args.hidden, activation="relu"), tf.keras.layers.Dense(10)]
        )
        m.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    def run(option: str, steps: int) -> tuple[float, float]:
        m = model()
        callbacks: list[Any] = []
        data: Any = dataset
        if option in ("stage", "callback"):
            data = fit.stamp_waits(dataset)
        if option == "py_function":
            data = py_function_stage(dataset)
        if option == "callback":
            callbacks = [client.StallCallback(report_url=url)]
        if option == "iterate":
            data = (batch for batch in client.iterate(dataset, report_url=url))
        m.fit(data, steps_per_epoch=20, epochs=1, verbose=0, callbacks=callbacks, shuffle=False)  # warm-up
        began, cpu = time.perf_counter(), time.process_time()
        m.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks, shuffle=False)
        return steps / (time.perf_counter() - began), (time.process_time() - cpu) / steps * 1e6

    rates: dict[str, list[float]] = {option: [] for option in OPTIONS}
    cpu: dict[str, list[float]] = {option: [] for option in OPTIONS}
    for r in range(args.rounds):
        order = OPTIONS[r % len(OPTIONS) :] + OPTIONS[: r % len(OPTIONS)]
        for option in order:
            rate, cpu_per_step = run(option, args.steps)
            rates[option].append(rate)
            cpu[option].append(cpu_per_step)
        print(f"round {r + 1}: " + ", ".join(f"{o} {rates[o][-1]:.0f}" for o in OPTIONS), flush=True)
    plain, plain_cpu = statistics.median(rates["plain"]), statistics.median(cpu["plain"])
    print(f"\nhidden {args.hidden}, batch {args.batch}, {args.steps} steps a fit, {args.rounds} rounds")
    print(
        f"{'option':12} {'steps/s median':>15} {'min':>6} {'max':>6} {'vs plain':>9} {'CPU µs/step':>12} {'added':>6}"
    )
    for option in OPTIONS:
        median, cpu_median = statistics.median(rates[option]), statistics.median(cpu[option])
        print(
            f"{option:12} {median:15.0f} {min(rates[option]):6.0f} {max(rates[option]):6.0f} {median / plain:9.2f} "
            f"{cpu_median:12.0f} {cpu_median - plain_cpu:+6.0f}"
        )
    print(json.dumps({"args": vars(args), "steps_per_second": rates, "cpu_us_per_step": cpu}))
    receiver.shutdown()


if __name__ == "__main__":
    main()
