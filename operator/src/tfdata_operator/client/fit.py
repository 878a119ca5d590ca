"""How long a Keras ``model.fit`` waits for data: a stage ``distribute()`` appends, and ``StallCallback``.

Keras (TensorFlow backend) calls ``get_next`` on the dataset's iterator inside its compiled
train function, so Python sees only whole steps: a callback's batch begin and end include the
wait for data and the compute alike. The wait is measured inside the input pipeline instead:
``stamp_waits`` zips the dataset read from the service with a stream of ``tf.timestamp()``
stamps. ``zip`` pulls its inputs in order within one ``get_next``, so the stamp is taken when
the step asks for an element, and the map after it takes the time the element arrived from the
service read; the difference is the time the step waited. The map adds it, and the element, to
two ``tf.Variable`` counters the process makes once (``assign_add``, in the graph: no call into
Python per element), and both maps run their few ops on the asking thread (``map_inline``): the
stage costs every ``distribute()`` user a few µs of CPU per element, not the quarter millisecond
a ``tf.py_function`` cost. A ``StallCallback``'s reporter reads the counters when it reports
(every ``interval`` seconds, and at the fit's end) and counts what they gained since its fit
began. Every ``steps_per_execution`` is covered, as each element is timed on its own. A prefetch
after ``distribute()`` (the user's, or a multi-device strategy's) moves the stamp to the
prefetching thread, which waits whenever the service is slower than the step, even by little:
then the fraction still reads near 0 while the service keeps up and near 1 while it is far
behind, but reads high in between.

TensorFlow is imported only when these are called (``StallCallback`` is created on first use,
to subclass ``tf.keras.callbacks.Callback``, Keras 3 or tf_keras, whichever ``tf.keras`` is).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from tfdata_operator.client.stall import INTERVAL_SECONDS, StallReporter

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger("tfdata_operator.client")
_lock = threading.Lock()
# The process's two counters (seconds waited, float64; elements, int64), made by the first stamp_waits.
_counters: list[tuple[tf.Variable, tf.Variable]] = []


def counters() -> tuple[tf.Variable, tf.Variable]:
    """The seconds every ``stamp_waits`` stage of this process waited, and its elements; made once."""
    with _lock:
        if not _counters:
            import tensorflow as tf

            failed: list[BaseException] = []

            def make() -> None:
                try:
                    _counters.append(
                        (
                            tf.Variable(tf.constant(0.0, tf.float64), trainable=False, name="tfdata_waited_seconds"),
                            tf.Variable(tf.constant(0, tf.int64), trainable=False, name="tfdata_waited_elements"),
                        )
                    )
                except BaseException as exc:
                    failed.append(exc)

            # In a thread of its own: eager, outside any tf.function being traced and outside a
            # distribution strategy's scope, which would make mirrored variables of them.
            maker = threading.Thread(target=make, name="stall-counters")
            maker.start()
            maker.join()
            if failed:
                raise failed[0]
        return _counters[0]


def totals() -> tuple[float, int]:
    """What the counters hold now: seconds waited and elements, since the process began (0 before any stage)."""
    if not _counters:
        return 0.0, 0
    waited, elements = _counters[0]
    return float(waited.numpy()), int(elements.numpy())


def map_inline(dataset: tf.data.Dataset, func: Any) -> tf.data.Dataset:
    """``dataset.map(func)``, with ``func`` run on the thread that asks for the element.

    ``map`` runs its function's ops on the inter-op thread pool: a hand-over per element that
    costs more than a few tiny ops (``stamp_waits`` with ``map``: +136 µs CPU a step of a fit on
    a loaded machine; inline: +5, ``benchmarks/bench_keras_stall.py``). Only TensorFlow's private
    ``_MapDataset`` takes ``use_inter_op_parallelism`` (2.16 to 2.21 at least); without it, ``map``.
    """
    try:
        from tensorflow.python.data.ops import map_op

        return map_op._MapDataset(dataset, func, use_inter_op_parallelism=False)
    except (ImportError, AttributeError, TypeError):
        return dataset.map(func)


def stamp_waits(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with the same elements, each timed from the step's request to its arrival."""
    import tensorflow as tf

    waited, elements = counters()
    asked = map_inline(tf.data.Dataset.from_tensors(tf.constant(0, tf.int8)).repeat(), lambda _: tf.timestamp())

    def arrived(asked_at: tf.Tensor, element: Any) -> Any:
        # Stateful ops in a tf.data function always run; negative: the element was there before the ask.
        waited.assign_add(tf.maximum(tf.timestamp() - asked_at, 0.0))
        elements.assign_add(1)
        return element

    stamped = map_inline(tf.data.Dataset.zip((asked, dataset)), arrived)
    # tf.data would put a prefetch after this map (a synchronous last stage): its thread, not the
    # step, would then ask for elements, and always wait while the service is slower than the step
    # even by little. Without the map there was none: the service read has its own buffer.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return stamped.with_options(options)


def stall_callback_class() -> type[Any]:
    """``StallCallback``: a Keras callback (created on first use, to import TensorFlow late)."""
    if _callback_class:
        return _callback_class[0]
    import tensorflow as tf

    from tfdata_operator import client

    class StallCallback(tf.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        """``model.fit(dataset, callbacks=[StallCallback()])``: reports the fit's data stall.

        ``dataset`` must come from ``distribute()``, whose last stage times each element; the
        report goes where ``iterate()``'s would (``report_url``, or the one published for
        ``name`` or with the service last distributed to), every ``interval`` seconds and once
        with ``done`` when the fit ends. A report that fails never stops training.
        """

        def __init__(
            self,
            name: str | None = None,
            *,
            report_url: str | None = None,
            job_name: str | None = None,
            interval: float = INTERVAL_SECONDS,
            environ: Any = None,
            directory: str | None = None,
        ) -> None:
            super().__init__()
            self._where = (name, report_url, job_name, environ, directory)
            self._interval = interval
            self.reporter: StallReporter | None = None

        def on_train_begin(self, logs: Any = None) -> None:
            url, job = client.report_target(*self._where)  # after distribute(), whenever this was made
            # From what the counters hold now: an earlier fit's elements are not this one's.
            self.reporter = StallReporter(url, job, self._interval, quiet_until_first=True, poll=totals)

        def on_train_end(self, logs: Any = None) -> None:
            reporter = self.reporter
            if reporter is None:
                return
            reporter.close()
            if not reporter.total_elements:
                log.warning(
                    "StallCallback measured no element: the dataset given to fit does not come from "
                    "tfdata_operator.client.distribute(), so no data stall was reported"
                )

    _callback_class.append(StallCallback)
    return StallCallback


_callback_class: list[type[Any]] = []
