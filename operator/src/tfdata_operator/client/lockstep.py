"""Many trainers of one synchronous job, in lockstep: who this trainer is, and how it must read.

A synchronous job (``MultiWorkerMirroredStrategy``: every step all-reduces across the trainers)
needs every trainer to get a full batch each step. Reading one shared job first-come-first-served
does not give that: TensorFlow hands elements to whichever trainer asks first, so the trainers
reach the end of a finite dataset after different numbers of elements, and the distributed
iterator pads the one that ran out with empty batches until all have (``tf.distribute``'s
``get_next_as_optional``). TensorFlow's answer is *coordinated reads*: with ``num_consumers``
and ``consumer_index`` the workers serve the job in rounds, one element to every consumer per
round (``RoundRobinTaskRunner``). They need a named job, an infinite dataset (a task refuses a
finite one, and a dataset of unknown length that ends fails one consumer and leaves the others
waiting for their round), workers outside the trainer
(``target_workers`` not ``LOCAL``), and no cross-trainer cache. After the read, each trainer's batches
must end with the training (``.take(epochs * steps_per_epoch)``): TensorFlow's distributed iterator,
let go of, waits for the batch it was prefetching without cancelling the read, and in lockstep a
batch past the last step needs rounds a finished trainer no longer asks for (docs/trainers.md).

Everything here is pure: the trainer's place from ``TF_CONFIG`` or from arguments, and the
decision of how to read (``plan``), with an error saying what to change for a setup that would
fail, hang or give unequal work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INFINITE = -1  # tf.data.INFINITE_CARDINALITY
UNKNOWN = -2  # tf.data.UNKNOWN_CARDINALITY
TRAINING_TASKS = ("chief", "worker")  # the tasks of a MultiWorkerMirroredStrategy cluster that train


class LockstepError(ValueError):
    """A setup in which the trainers of one synchronous job would not get equal, full batches."""


@dataclass(frozen=True)
class Place:
    """This trainer's place among the trainers of one synchronous job."""

    index: int
    count: int
    source: str  # "TF_CONFIG" or "arguments", for messages

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise LockstepError(
                f"trainer index {self.index} of {self.count} trainers (from {self.source}): the index must be "
                f"in 0..count-1 and the count at least 1"
            )


@dataclass(frozen=True)
class Read:
    """How this trainer reads: TensorFlow's coordinated-read arguments, or none (first-come-first-served)."""

    consumer_index: int | None = None
    num_consumers: int | None = None

    def kwargs(self) -> dict[str, int]:
        if self.num_consumers is None:
            return {}
        return {"consumer_index": int(self.consumer_index or 0), "num_consumers": self.num_consumers}


def place_from_tf_config(tf_config: str | Mapping[str, Any] | None) -> Place | None:
    """This trainer's place from ``TF_CONFIG``; None when it names no synchronous training task.

    The trainers are the ``chief`` (index 0) and the ``worker`` tasks (after the chief), as
    ``MultiWorkerMirroredStrategy`` counts them. An ``evaluator`` trains nothing, and a cluster with
    ``ps`` tasks trains asynchronously (``ParameterServerStrategy``): neither reads in lockstep.
    """
    if tf_config is None or tf_config == "":
        return None
    if isinstance(tf_config, str):
        try:
            config = json.loads(tf_config)
        except json.JSONDecodeError as exc:
            raise LockstepError(f"TF_CONFIG is not JSON ({exc}): {tf_config[:200]!r}") from None
    else:
        config = tf_config
    if not isinstance(config, Mapping):
        raise LockstepError(f"TF_CONFIG must be a JSON object with 'cluster' and 'task', got {tf_config!r:.200}")
    cluster = config.get("cluster") or {}
    task = config.get("task") or {}
    if not isinstance(cluster, Mapping) or not isinstance(task, Mapping):
        raise LockstepError("TF_CONFIG's 'cluster' and 'task' must be objects")
    kind = str(task.get("type", ""))
    if cluster.get("ps") or kind not in TRAINING_TASKS:
        return None
    try:
        index = int(task.get("index", 0))
    except (TypeError, ValueError):
        raise LockstepError(f"TF_CONFIG's task index must be an integer, got {task.get('index')!r}") from None
    chiefs = len(cluster.get("chief") or [])
    workers = len(cluster.get("worker") or [])
    if chiefs > 1:
        raise LockstepError(f"TF_CONFIG names {chiefs} chief tasks; a cluster has at most one")
    if kind == "chief":
        if chiefs == 0:
            raise LockstepError("TF_CONFIG's task is the chief, but its cluster has no 'chief' entry")
        return Place(index, chiefs + workers, "TF_CONFIG")
    if index >= workers:
        raise LockstepError(
            f"TF_CONFIG's task is worker {index}, but its cluster lists {workers} worker(s): "
            "give every trainer the same cluster and its own index"
        )
    return Place(chiefs + index, chiefs + workers, "TF_CONFIG")


def place(
    consumer_index: int | None, num_consumers: int | None, tf_config: str | Mapping[str, Any] | None
) -> Place | None:
    """The place given as arguments (both or neither), else the one in ``TF_CONFIG``."""
    if (consumer_index is None) != (num_consumers is None):
        raise LockstepError(
            f"give consumer_index and num_consumers together (got consumer_index={consumer_index}, "
            f"num_consumers={num_consumers}), or neither to take them from TF_CONFIG"
        )
    if num_consumers is not None:
        return Place(int(consumer_index or 0), int(num_consumers), "arguments")
    return place_from_tf_config(tf_config)


def plan(
    where: Place | None,
    *,
    lockstep: bool | None,
    job_name: str | None,
    cardinality: int,
    target_workers: str = "AUTO",
    cross_trainer_cache: bool = False,
) -> Read:
    """How to read: coordinated among ``where.count`` trainers, or first-come-first-served.

    ``lockstep=None`` reads in lockstep when the place names more than one trainer; ``True`` requires
    a place; ``False`` reads first-come-first-served (the trainers then get unequal numbers of
    elements). ``cardinality`` is the dataset's (``tf.data.INFINITE_CARDINALITY`` is -1, unknown -2):
    in lockstep only an infinite one is read.
    """
    if lockstep is False:
        if where is not None and where.source == "arguments":
            raise LockstepError(
                "lockstep=False reads first-come-first-served, but consumer_index and num_consumers ask for "
                "coordinated reads: leave them out, or drop lockstep=False"
            )
        return Read()
    if where is None:
        if lockstep:
            raise LockstepError(
                "lockstep=True needs this trainer's place: set TF_CONFIG (a 'chief' or 'worker' task of the "
                "cluster) or pass consumer_index= and num_consumers="
            )
        return Read()
    if where.count == 1:
        return Read()  # one trainer: nothing to keep in step, read as before
    many = f"{where.count} trainers in lockstep (trainer {where.index}, from {where.source})"
    _check_coordinated_reads(many, job_name, target_workers, cross_trainer_cache)
    _check_infinite(many, cardinality)
    return Read(where.index, where.count)


def _check_coordinated_reads(many: str, job_name: str | None, target_workers: str, cross_trainer_cache: bool) -> None:
    """Refuse what TensorFlow's coordinated reads cannot serve: no shared job, workers in the trainer's
    process, a cross-trainer cache. ``many`` names the trainers, for the message."""
    if not job_name:
        raise LockstepError(
            f"{many} must share one tf.data job: pass the same job_name= in every trainer (for example the "
            "training Job's uid). Without one each trainer gets a job of its own and reads every element"
        )
    if target_workers.upper() == "LOCAL":
        raise LockstepError(
            f"{many} read with coordinated reads, which TensorFlow refuses with target_workers='LOCAL' "
            "(workers in the trainer's process): use target_workers='AUTO', or lockstep=False to read each "
            "trainer's local workers on its own"
        )
    if cross_trainer_cache:
        raise LockstepError(
            f"{many} read with coordinated reads, which TensorFlow refuses together with a cross-trainer "
            "cache (the cache is for independent trials that each read the whole stream): drop "
            "cross_trainer_cache=, or pass lockstep=False if these trainers are independent trials"
        )


def _check_infinite(many: str, cardinality: int) -> None:
    """Refuse a dataset that ends, or may: coordinated reads need an infinite one."""
    if cardinality == UNKNOWN:
        raise LockstepError(
            f"{many} need an infinite dataset, and TensorFlow cannot tell whether this one ends (a filter, a "
            "generator or another transformation of unknown length is last): if it ends, one trainer fails and "
            "the others wait for their round forever. Add .repeat() at the end of the pipeline (before "
            "distribute), which makes it infinite, and bound each epoch with steps_per_epoch. Or pass "
            "lockstep=False to read first-come-first-served"
        )
    if cardinality != INFINITE:
        raise LockstepError(
            f"{many} need an infinite dataset, but this one ends after {cardinality} element(s): TensorFlow's "
            "coordinated reads refuse a finite dataset, and read first-come-first-served the trainers reach "
            "its end after different numbers of elements (the one that runs out trains on empty batches). "
            "Add .repeat() at the end of the pipeline (before distribute) and bound each epoch in the "
            "training loop: steps_per_epoch = elements per pass // global batch size (model.fit("
            "steps_per_epoch=...), or take that many steps). Or pass lockstep=False to read "
            "first-come-first-served"
        )
