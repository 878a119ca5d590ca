"""Save a dataset once through a TFDataService, then read it back without recomputing it.

::

    from tfdata_operator.client import snapshots
    snapshots.save(dataset, "imagenet-v3", service="imagenet")        # returns once submitted
    snapshots.wait("imagenet-v3", service="imagenet", progress=print) # until COMPLETED
    dataset = snapshots.load("imagenet-v3", service="imagenet")       # tf.data.Dataset.load

A snapshot is TensorFlow's ``tf.data.experimental.distributed_save``: the service's workers run
the pipeline and write its elements to ``<snapshot dir>/<name>``, which every worker and
trainer must reach by the same path, on a file system with atomic rename (``gs://``, a
ReadWriteMany volume). The snapshot directory is ``snapshot_dir=``, else the published setting
or the variable ``TFDATA_SNAPSHOT_DIR`` (``discovery.ClientSettings.snapshot_dir``). The
dispatcher must be fault tolerant (``spec.dispatcher.faultTolerantMode``, the default) and the workers must
not change while it writes: a worker that leaves for good stalls the snapshot (TensorFlow does
not hand its stream to another).

``wait`` and ``progress`` read the dispatcher pod's ``/v1/snapshots`` (``wire.snapshots``), the
same port the data-stall reports go to; ``load`` reads the files itself and needs no service
unless ``distributed=True``. TensorFlow is imported only when these are called.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfdata_operator.wire import discovery, snapshots
from tfdata_operator.wire.discovery import ClientSettings, DiscoveryError
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsError, SnapshotsReport

if TYPE_CHECKING:
    import tensorflow as tf

SNAPSHOT_DIR_ENV = discovery.KEYS["snapshot_dir"]
POLL_SECONDS = 5.0
REQUEST_TIMEOUT_SECONDS = 40.0  # above the dispatcher's own wait for its TensorFlow process
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class SnapshotError(RuntimeError):
    """A snapshot cannot be saved, waited for or loaded; the message says why and what to do."""


class SnapshotFailedError(SnapshotError):
    """TensorFlow gave up on the snapshot (its ERROR file); ``progress.error`` holds its text."""

    def __init__(self, progress: SnapshotProgress) -> None:
        super().__init__(
            f"snapshot {progress.path} failed: {progress.error or 'no error text'}. Fix the pipeline and save "
            "it again under a new name (or delete the directory first)"
        )
        self.progress = progress


class SnapshotDeletedError(SnapshotError):
    """The snapshot's data was deleted (``DELETE /v1/snapshots`` on the dispatcher): only a
    tombstone is left at its path, which nothing can read."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"snapshot {path} was deleted: its data is gone, and the few files left at the path are a tombstone "
            "the dispatcher needs. Save the dataset again under a new name"
        )
        self.path = path


class SnapshotNotReadyError(SnapshotError):
    """``load`` of a snapshot that is not COMPLETED, without ``stream=True``."""

    def __init__(self, path: str, state: str) -> None:
        super().__init__(
            f"snapshot {path} is {state}, not {snapshots.COMPLETED}: reading it would wait for every chunk still "
            "to be written, for ever if the snapshot stalls. wait() for it first, or pass stream=True to read it "
            "while it is written"
            + (
                " (a MISSING one: check the name and the snapshot directory, or save() it)"
                if state == "MISSING"
                else ""
            )
        )
        self.path = path
        self.state = state


class SnapshotTimeoutError(SnapshotError, TimeoutError):
    """``wait`` gave up; ``progress`` is the last reading (None if the dispatcher never answered)."""

    def __init__(self, message: str, progress: SnapshotProgress | None) -> None:
        super().__init__(message)
        self.progress = progress


class SnapshotUnsupportedError(SnapshotError):
    """This trainer's TensorFlow lacks what the call needs."""


@dataclass(frozen=True)
class Target:
    """Where a snapshot lives and how to reach the service that writes it."""

    name: str
    path: str
    settings: ClientSettings | None
    address: str | None  # what TensorFlow's service= takes
    snapshots_url: str | None


def snapshots_url_from(settings: ClientSettings) -> str | None:
    """The published progress URL, or the one beside the published report URL (the same port)."""
    if settings.snapshots_url:
        return settings.snapshots_url
    if not settings.report_url:
        return None
    parts = urllib.parse.urlsplit(settings.report_url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, snapshots.SNAPSHOTS_PATH, "", ""))


def resolve(
    name: str,
    service: str | None = None,
    *,
    snapshot_dir: str | None = None,
    address: str | None = None,
    snapshots_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> Target:
    """The snapshot's path and its service, from the arguments, then the published settings of
    ``service``, then ``TFDATA_SNAPSHOT_DIR``."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SnapshotError(
            f"a snapshot name must match {NAME.pattern} (it becomes a directory under the snapshot directory), "
            f"got {name!r}"
        )
    env = os.environ if environ is None else environ
    settings: ClientSettings | None = None
    # Without settings, explicit arguments may still be enough; what is missing is said where needed.
    with contextlib.suppress(DiscoveryError):
        settings = discovery.load(service, env, directory)
    base = snapshot_dir or (settings.snapshot_dir if settings else None) or env.get(SNAPSHOT_DIR_ENV, "").strip()
    if not base:
        raise SnapshotError(
            f"no snapshot directory: pass snapshot_dir= or set {SNAPSHOT_DIR_ENV} to a directory every tf.data "
            "worker and this trainer reach by the same path, on a file system with atomic rename (gs://..., a "
            "ReadWriteMany volume)"
        )
    return Target(
        name=name,
        path=base.rstrip("/") + "/" + name,
        settings=settings,
        address=address or (settings.address if settings else None),
        snapshots_url=snapshots_url or (snapshots_url_from(settings) if settings else None),
    )


def _need(value: str | None, what: str, service: str | None) -> str:
    if value:
        return value
    wanted = f"service {service!r}" if service else "a TFDataService"
    raise SnapshotError(
        f"no {what}: found no published settings for {wanted} (give the trainer pod the ConfigMap "
        f"'{service or '<service>'}-client' with envFrom), and none was passed"
    )


def save(
    dataset: tf.data.Dataset,
    name: str,
    service: str | None = None,
    *,
    compression: str | None = "AUTO",
    exist_ok: bool = False,
    check_servers: bool = True,
    snapshot_dir: str | None = None,
    address: str | None = None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> str:
    """Starts writing ``dataset`` to ``<snapshot dir>/<name>`` through the service's workers;
    returns the path once the dispatcher has accepted it (``wait`` for the end).

    ``compression`` goes to TensorFlow ("AUTO", "GZIP", "SNAPPY" or None). ``exist_ok=True``
    takes a snapshot the dispatcher already started at that path as this one (a trainer that
    runs again); otherwise TensorFlow's ``AlreadyExistsError`` is raised. As ``distribute`` does,
    a pipeline the servers cannot run is refused first (``MissingOpError``, ...), when the
    published settings say where to read what they run; ``check_servers=False`` skips that.
    """
    import tensorflow as tf

    from tfdata_operator.client import servercheck
    from tfdata_operator.client.pipeline import graph_def

    target = resolve(name, service, snapshot_dir=snapshot_dir, address=address, environ=environ, directory=directory)
    service_address = _need(target.address, "dispatcher address (address=)", service)
    distributed_save = getattr(tf.data.experimental, "distributed_save", None)
    if distributed_save is None:
        raise SnapshotUnsupportedError(
            f"TensorFlow {tf.__version__} has no tf.data.experimental.distributed_save (TensorFlow 2.16 and older "
            "have only the raw op): save from a trainer on a newer TensorFlow"
        )
    if check_servers and target.settings is not None:
        servercheck.check_servers(graph_def(dataset), target.settings)
    # TensorFlow takes host:port here: with "grpc://" in front, its client retries forever.
    host = service_address.partition("://")[2] or service_address
    try:
        distributed_save(dataset, target.path, host, compression=compression)
    except tf.errors.AlreadyExistsError:
        if not exist_ok:
            raise
    return target.path


def read_report(url: str, paths: tuple[str, ...] = (), timeout: float = REQUEST_TIMEOUT_SECONDS) -> SnapshotsReport:
    """One GET of a dispatcher's ``/v1/snapshots``; raises OSError or SnapshotsError."""
    query = urllib.parse.urlencode([(snapshots.PATH_PARAMETER, p) for p in paths])
    with urllib.request.urlopen(url + (f"?{query}" if query else ""), timeout=timeout) as response:
        return SnapshotsReport.from_json(response.read())


def progress(
    name: str,
    service: str | None = None,
    *,
    snapshot_dir: str | None = None,
    snapshots_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> SnapshotProgress:
    """The snapshot's progress as the dispatcher reads it now (at most a few seconds old)."""
    target = resolve(
        name, service, snapshot_dir=snapshot_dir, snapshots_url=snapshots_url, environ=environ, directory=directory
    )
    return _read_one(_need(target.snapshots_url, "snapshot progress URL (snapshots_url=)", service), target.path)


def _read_one(url: str, path: str) -> SnapshotProgress:
    found = read_report(url, (path,)).get(path)
    if found is None:
        raise SnapshotsError(f"the dispatcher's answer at {url} leaves out {path}")
    return found


def wait(
    name: str,
    service: str | None = None,
    *,
    timeout: float | None = None,
    progress: Callable[[SnapshotProgress], Any] | None = None,
    poll_seconds: float = POLL_SECONDS,
    snapshot_dir: str | None = None,
    snapshots_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> SnapshotProgress:
    """Waits until the snapshot is COMPLETED and returns its last reading.

    Raises ``SnapshotFailedError`` (TensorFlow's error text) when it failed,
    ``SnapshotDeletedError`` when its data was deleted, and ``SnapshotTimeoutError`` after
    ``timeout`` seconds (None: no limit). A MISSING snapshot is waited for too (another process
    may not have saved it yet), and so is a dispatcher that does not answer for a while (it
    restarts). ``progress`` is called with every reading.
    """
    target = resolve(
        name, service, snapshot_dir=snapshot_dir, snapshots_url=snapshots_url, environ=environ, directory=directory
    )
    url = _need(target.snapshots_url, "snapshot progress URL (snapshots_url=)", service)
    deadline = None if timeout is None else time.monotonic() + timeout
    last: SnapshotProgress | None = None
    trouble: str | None = None
    while True:
        try:
            last = _read_one(url, target.path)
            trouble = None
        except (OSError, SnapshotsError) as exc:  # urllib's errors are OSErrors
            trouble = f"{url} did not answer: {exc}"
        else:
            if progress is not None:
                progress(last)
            if last.state == snapshots.COMPLETED:
                return last
            if last.state == snapshots.FAILED:
                raise SnapshotFailedError(last)
            if last.state == snapshots.DELETED:
                raise SnapshotDeletedError(target.path)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            seen = last.describe() if last is not None else "no reading"
            raise SnapshotTimeoutError(
                f"snapshot {target.path} not completed after {timeout:g}s: {seen}"
                + (f"; {trouble}" if trouble else ""),
                last,
            )
        time.sleep(poll_seconds if remaining is None else min(poll_seconds, remaining))


def local_state(path: str) -> tuple[str, str | None]:
    """The snapshot's state from its files, read by this trainer, and ERROR's text when FAILED."""
    import tensorflow as tf

    try:
        names = tf.io.gfile.listdir(path)
    except tf.errors.NotFoundError:
        return snapshots.MISSING, None
    state = snapshots.state_from_names(names)
    if state != snapshots.FAILED:
        return state, None
    with tf.io.gfile.GFile(path.rstrip("/") + "/" + snapshots.ERROR_FILE, "rb") as file:
        return state, snapshots.error_text(file.read())


def load(
    name: str,
    service: str | None = None,
    *,
    distributed: bool = False,
    stream: bool = False,
    element_spec: Any = None,
    snapshot_dir: str | None = None,
    address: str | None = None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
    **distribute_kwargs: Any,
) -> tf.data.Dataset:
    """The snapshot's elements: ``tf.data.Dataset.load`` of ``<snapshot dir>/<name>``.

    Only a COMPLETED snapshot is read, unless ``stream=True``: then ``Dataset.load(wait=True)``
    reads its chunks as they are committed and ends once it is done (and, when nothing is there
    yet, this call blocks until it appears). TensorFlow itself reads a snapshot being written that
    way even without ``wait=True`` (2.21: the iterator waits for each next chunk until DONE), so
    without ``stream=True`` an incomplete one is refused rather than read with an iterator that
    may wait for ever. A FAILED one raises ``SnapshotFailedError`` either way, a deleted one
    ``SnapshotDeletedError``. ``distributed=True`` reads it through the service
    (``client.distribute`` with the service's sharding policy, and ``distribute_kwargs``): with
    DYNAMIC sharding the workers share out the snapshot's chunks, each read once, and they read
    the files, not this trainer.
    """
    import tensorflow as tf

    target = resolve(name, service, snapshot_dir=snapshot_dir, address=address, environ=environ, directory=directory)
    state, error = local_state(target.path)
    if state == snapshots.DELETED:
        raise SnapshotDeletedError(target.path)
    if state == snapshots.FAILED:
        raise SnapshotFailedError(SnapshotProgress(target.path, state, error=error))
    if state != snapshots.COMPLETED and not stream:
        raise SnapshotNotReadyError(target.path, state)
    if stream:
        if "wait" not in inspect.signature(tf.data.Dataset.load).parameters:
            raise SnapshotUnsupportedError(
                f"TensorFlow {tf.__version__}'s Dataset.load cannot read a snapshot while it is written (no wait=): "
                "wait() for it and load it without stream=True, or read from a trainer on a newer TensorFlow"
            )
        dataset = tf.data.Dataset.load(target.path, element_spec=element_spec, wait=True)
    else:
        dataset = tf.data.Dataset.load(target.path, element_spec=element_spec)
    if distributed:
        from tfdata_operator.client import distribute

        if address is not None:
            distribute_kwargs.setdefault("address", address)
        dataset = dataset.apply(distribute(service, environ=environ, directory=directory, **distribute_kwargs))
    return dataset


__all__ = [
    "SnapshotDeletedError",
    "SnapshotError",
    "SnapshotFailedError",
    "SnapshotNotReadyError",
    "SnapshotTimeoutError",
    "SnapshotUnsupportedError",
    "load",
    "progress",
    "save",
    "wait",
]
