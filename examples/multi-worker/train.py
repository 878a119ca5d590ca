"""One trainer of a synchronous job: tf-keras ``model.fit`` under MultiWorkerMirroredStrategy, reading a
TFDataService in lockstep through the client helper (docs/trainers.md, "Many trainers in lockstep").

Run by entry.py, which sets TF_CONFIG; the pod sets TF_USE_LEGACY_KERAS=1 (Keras 3's ``model.fit`` fails
under MultiWorkerMirroredStrategy, keras-team/keras#20585) and takes the service's published settings
with ``envFrom``. Each epoch is one pass over the data, counted in steps. Each trainer's dataset
(``distribute_datasets_from_function``: its own batches) ends with the training's last step: TensorFlow
prefetches each trainer's input ahead of its steps, and at the end of ``fit`` it waits for the batch it
was prefetching, which in lockstep only comes if every trainer still asks for it. Every trainer ends
with the same model and prints the same losses.
"""

import argparse
import os

import tensorflow as tf

from tfdata_operator.client import distribute

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--job-name", required=True, help="the tf.data job: the same in every trainer, new per run")
parser.add_argument("--service", default="multi-worker", help="the TFDataService whose published settings to use")
parser.add_argument("--address", help="the dispatcher's address, instead of the published settings")
parser.add_argument("--elements", type=int, default=8192, help="elements in one pass over the data")
parser.add_argument("--batch", type=int, default=64, help="batch size of each trainer")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
if os.environ.get("TF_USE_LEGACY_KERAS") != "1" or not tf.keras.__name__.startswith("tf_keras"):
    raise SystemExit("set TF_USE_LEGACY_KERAS=1 and install tf-keras: Keras 3's fit fails under this strategy")


def pipeline() -> tf.data.Dataset:
    """Your preprocessing, run by the service's workers; here y = 3 x0 - 2 x1 + 1 on a grid of points."""

    def example(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = tf.stack([tf.cast(i % 64, tf.float32) / 64.0, tf.cast(i // 64 % 64, tf.float32) / 64.0])
        return x, 3.0 * x[0] - 2.0 * x[1] + 1.0

    return tf.data.Dataset.range(args.elements).map(example)


strategy = tf.distribute.MultiWorkerMirroredStrategy()  # TF_CONFIG: this trainer's place
trainers = strategy.num_replicas_in_sync
steps_per_epoch = args.elements // (args.batch * trainers)  # one pass over the data, all trainers together
steps = args.epochs * steps_per_epoch

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss="mse")

if args.address:
    read = distribute(address=args.address, sharding_policy="DYNAMIC", job_name=args.job_name)
else:
    read = distribute(args.service, job_name=args.job_name)


def trainer_dataset(_: tf.distribute.InputContext) -> tf.data.Dataset:
    """This trainer's batches: read from an endless pipeline, as coordinated reads need, and ended by
    ``take`` at the training's last step, so that no trainer's input waits for a round at the end."""
    return pipeline().repeat().apply(read).batch(args.batch, drop_remainder=True).take(steps)


history = model.fit(
    strategy.distribute_datasets_from_function(trainer_dataset),
    epochs=args.epochs,
    steps_per_epoch=steps_per_epoch,
    verbose=2,
)
task = strategy.cluster_resolver.task_id
weights = [round(float(w), 4) for v in model.get_weights() for w in v.flat]
losses = ", ".join(f"{loss:.6f}" for loss in history.history["loss"])
print(f"trainer {task} of {trainers}: {args.epochs} epochs of {steps_per_epoch} steps, ", end="")
print(f"losses [{losses}], weights {weights}")
