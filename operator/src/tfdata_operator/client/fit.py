"""How long a Keras ``model.fit`` waits for data: a stage ``distribute()`` appends, and ``StallCallback``.

Keras (TensorFlow backend) calls ``get_next`` on the dataset's iterator inside its compiled
train function, so Python sees only whole steps: a callback's batch begin and end include the
wait for data and the compute alike. The wait is measured inside the input pipeline instead:
``stamp_waits`` zips the dataset read from the service with a stream of ``tf.timestamp()``
stamps. ``zip`` pulls its inputs in order within one ``get_next``, so the stamp is taken when
the step asks for an element, and the map after it takes the time the element arrived from the
service read; the difference is the time the step waited. A ``tf.py_function`` hands it to the
``StallReporter`` of each fit that runs with a ``StallCallback`` (none: it returns at once).
Every ``steps_per_execution`` is covered, as each element is timed on its own. A prefetch
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
# The reporters of the fits running now with a StallCallback (normally none or one).
_active: tuple[StallReporter, ...] = ()


def start(reporter: StallReporter) -> None:
    global _active
    with _lock:
        _active = (*_active, reporter)


def stop(reporter: StallReporter) -> None:
    global _active
    with _lock:
        _active = tuple(r for r in _active if r is not reporter)


def record(waited: float) -> None:
    """One element arrived after the step waited ``waited`` seconds (negative: it was already there)."""
    for reporter in _active:
        reporter.add(max(0.0, waited), 1)


def _record_tensor(waited: Any) -> Any:
    if _active:
        record(float(waited))
    return waited


def stamp_waits(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with the same elements, each timed from the step's request to its arrival."""
    import tensorflow as tf

    asked = tf.data.Dataset.from_tensors(tf.constant(0, tf.int8)).repeat().map(lambda _: tf.timestamp())

    def arrived(asked_at: tf.Tensor, element: Any) -> Any:
        tf.py_function(_record_tensor, [tf.timestamp() - asked_at], tf.float64)  # stateful: always runs
        return element

    stamped = tf.data.Dataset.zip((asked, dataset)).map(arrived)
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
            self.reporter = StallReporter(url, job, self._interval, quiet_until_first=True)
            start(self.reporter)

        def on_train_end(self, logs: Any = None) -> None:
            reporter = self.reporter
            if reporter is None:
                return
            stop(reporter)
            reporter.close()
            if not reporter.total_elements:
                log.warning(
                    "StallCallback measured no element: the dataset given to fit does not come from "
                    "tfdata_operator.client.distribute(), so no data stall was reported"
                )

    _callback_class.append(StallCallback)
    return StallCallback


_callback_class: list[type[Any]] = []
