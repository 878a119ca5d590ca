"""One trainer of a synchronous MultiWorkerMirroredStrategy job, for tests/server/test_lockstep.py.

Argument: one JSON object: address, policy, job_name, tf_config, n (elements per pass), batch (per
trainer), epochs, way ("loop": a custom loop over ``distribute_datasets_from_function``; "fit": tf-keras
``model.fit`` over the same; "refuse": only apply the helper to a finite dataset), and optionally
linger (seconds this trainer stays in ``model.fit`` after its last step, its input still alive) and
slow_us (microseconds the workers sleep before each element). Both
ways read as docs/trainers.md says: each trainer's batches end with ``.take(epochs * steps_per_epoch)``.
Prints one JSON line: ``{"steps": [[ids of each step's batch], ...], "epochs": [mean loss, ...]}`` or
``{"error": "<type>", "message": "..."}``.
"""

import json
import os
import sys
import time

args = json.loads(sys.argv[1])
os.environ["TF_CONFIG"] = json.dumps(args["tf_config"])  # before TensorFlow reads it
if args["way"] == "fit":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf-keras: Keras 3's fit fails under MWMS (keras#20585)

import tensorflow as tf  # noqa: E402
from tensorflow.python.data.experimental.ops import testing  # noqa: E402

from tfdata_operator import client  # noqa: E402

N, BATCH, EPOCHS = args["n"], args["batch"], args["epochs"]


def pipeline() -> tf.data.Dataset:
    def element(i: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.stack([tf.cast(i % 7, tf.float32), tf.cast(i % 3, tf.float32)])
        return {"id": i, "x": x, "y": tf.cast(i % 2, tf.float32)}

    dataset = tf.data.Dataset.range(N).map(element)
    if args.get("slow_us"):  # the workers sleep before each element: the trainers wait for data, their buffers low
        dataset = dataset.apply(testing.sleep(args["slow_us"]))
    return dataset


def read(repeat: bool = True) -> tf.data.Dataset:
    dataset = pipeline().repeat() if repeat else pipeline()
    dataset = dataset.apply(client.distribute(address=args["address"], sharding_policy=args["policy"],
                                              job_name=args["job_name"], check_servers=False))  # fmt: skip
    return dataset.batch(BATCH, drop_remainder=True)


def coordinated(dataset: tf.data.Dataset) -> list[int]:
    """The ``consumer_index`` and ``num_consumers`` the dataset's read of the service carries (-1: none)."""
    graph = tf.compat.v1.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor).numpy())
    nodes = {node.name: node for node in graph.node}
    (read,) = (node for node in graph.node if node.op.startswith("DataServiceDataset"))
    values = [int(tf.make_ndarray(nodes[name.split(":")[0]].attr["value"].tensor)) for name in read.input[5:7]]
    return values


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


if args["way"] == "refuse":
    try:
        read(repeat=False)
        emit({"error": None})
    except Exception as exc:
        emit({"error": type(exc).__name__, "message": str(exc)})
    raise SystemExit(0)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync
GLOBAL = BATCH * strategy.num_replicas_in_sync
STEPS = N // GLOBAL  # one pass over the data, the whole job together, per epoch


def trainer_batches(_: tf.distribute.InputContext) -> tf.data.Dataset:
    """This trainer's batches, ending with the training's last step."""
    return read().take(EPOCHS * STEPS)


if args["way"] == "fit":

    class Recorded(tf.keras.Model):
        """A plain fit step that also hands each trainer's ids to the callbacks. Keras sums what a step
        returns over the trainers, so each puts its ids in its own row: the sum is every trainer's ids."""

        def train_step(self, data: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            row = tf.distribute.get_replica_context().replica_id_in_sync_group
            ids = tf.scatter_nd([[row]], [data["id"]], [strategy.num_replicas_in_sync, BATCH])
            return {**super().train_step((data["x"], data["y"])), "ids": ids}

    class Record(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[list[int]] = []
            self.losses: list[float] = []
            self.weights: list[list[float]] = []

        def on_train_end(self, logs: dict | None = None) -> None:
            time.sleep(args.get("linger", 0))  # in fit, its input still alive, after the other may have gone

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            assert logs is not None
            self.steps.append([int(i) for i in logs["ids"][strategy.cluster_resolver.task_id]])
            self.losses.append(float(logs["loss"]))
            self.weights.append([float(w) for v in self.model.get_weights() for w in v.flat])

    with strategy.scope():
        inputs = tf.keras.Input((2,), name="x")
        model = Recorded(inputs, tf.keras.layers.Dense(1)(inputs))
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    record = Record()
    dist = strategy.distribute_datasets_from_function(trainer_batches)
    history = model.fit(dist, epochs=EPOCHS, steps_per_epoch=STEPS, callbacks=[record], verbose=0)
    emit({"steps": record.steps, "losses": record.losses, "epochs": history.history["loss"],
          "weights": record.weights, "steps_per_epoch": STEPS, "coordinated": coordinated(read())})  # fmt: skip
    raise SystemExit(0)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)

dist = strategy.distribute_datasets_from_function(trainer_batches)


@tf.function
def train_step(iterator):
    def step(batch):
        with tf.GradientTape() as tape:
            pred = tf.squeeze(model(batch["x"], training=True), -1)
            loss = tf.nn.compute_average_loss(tf.square(pred - batch["y"]), global_batch_size=GLOBAL)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss, batch["id"]

    loss, ids = strategy.run(step, args=(next(iterator),))
    return strategy.reduce("SUM", loss, axis=None), ids


steps, epochs = [], []
iterator = iter(dist)
for _epoch in range(EPOCHS):
    losses = []
    for _ in range(STEPS):
        loss, ids = train_step(iterator)
        losses.append(float(loss))
        steps.append(strategy.experimental_local_results(ids)[0].numpy().tolist())
    epochs.append(sum(losses) / len(losses))
emit({"steps": steps, "epochs": epochs, "steps_per_epoch": STEPS, "coordinated": coordinated(read())})
