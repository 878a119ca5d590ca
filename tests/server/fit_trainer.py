"""A Keras trainer for tests/server/test_trainer_client.py: ``model.fit`` on a ``distribute()`` dataset.

Argument: one JSON object (address, policy, server_info_url, report_url, slow: "data", "step"
or "none", steps, or fits: the steps of each of several fits in a row). With ``slow="data"`` the
workers sleep before each batch, with ``slow="step"`` the training step does (a callback that
sleeps after each batch). The fit's only addition for reporting is
``callbacks=[client.StallCallback(...)]``, one for each fit. Prints ``fit started`` when a fit
begins, then one JSON line: what the last fit's reporter measured and its steps/s, each fit's
figures (``fits``), and what the helper logged.
"""

import json
import logging
import sys
import time

import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

from tfdata_operator import client

args = json.loads(sys.argv[1])
logged: list[str] = []  # what the helper logged (a report it could not send)
handler = logging.Handler()
handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
logging.getLogger("tfdata_operator.client").addHandler(handler)
SLOW_SECONDS = args.get("slow_seconds", 0.03)
steps = args.get("steps", 300)

dataset = tf.data.Dataset.range(100_000).map(
    lambda i: (tf.fill([8], tf.cast(i % 7, tf.float32)), i % 3)
).batch(4)  # fmt: skip
if args["slow"] == "data":
    dataset = dataset.apply(testing.sleep(int(SLOW_SECONDS * 1e6)))  # in the worker, before each batch
dataset = dataset.apply(
    client.distribute(address=args["address"], sharding_policy=args["policy"], server_info_url=args["server_info_url"])
)

model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Progress(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs: object = None) -> None:
        print("fit started", flush=True)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if args["slow"] == "step":
            time.sleep(SLOW_SECONDS)  # a training step that takes its time


fits = []
for fit_steps in args.get("fits", [steps]):  # fits in a row, each with a StallCallback of its own
    stall = client.StallCallback(report_url=args["report_url"], interval=args.get("interval", 1.0))
    began = time.monotonic()
    model.fit(dataset, steps_per_epoch=fit_steps, epochs=1, verbose=0, callbacks=[Progress(), stall])
    seconds = time.monotonic() - began
    reporter = stall.reporter
    fits.append(
        {
            "elements": reporter.total_elements,
            "stall_fraction": reporter.stall_fraction,
            "waited": reporter.total_waited,
            "steps_per_second": fit_steps / seconds,
        }
    )
print(json.dumps({**fits[-1], "fits": fits, "logged": logged}), flush=True)
