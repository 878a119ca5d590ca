"""Read from a TFDataService in a trainer: ``dataset.apply(distribute("imagenet"))``.

What it adds to ``tf.data.experimental.service.distribute``:

- discovery: the address, sharding policy and transfer protocol come from the settings the
  operator publishes (ConfigMap ``<name>-client``, as environment or mounted files; see
  ``tfdata_operator.wire.discovery``), so a trainer needs no Kubernetes credentials;
- the processing mode the service's sharding policy needs, and a clear error for one that
  contradicts it;
- pipeline consistency: trainers sharing a ``job_name`` must build the same pipeline. Each
  trainer fingerprints its dataset graph (``pipeline``, ``fingerprint``) and claims the job for
  that fingerprint on the dispatcher itself (``claim``): it registers a tiny *claim* dataset
  under the id ``tfdata-operator.job.<job_name>`` whose element structure carries the
  fingerprint, the element spec and the transformations. TensorFlow keeps the first registration
  and refuses a later one with another structure, so the second trainer learns the first one's
  fingerprint (read back with the dispatcher's metadata call) with no server of ours involved,
  and the claim lives exactly as long as the dispatcher's other state (it is journaled with it);
- many trainers of one synchronous job (``TF_CONFIG`` with more than one chief or worker task, or
  ``consumer_index``/``num_consumers``) read in lockstep, with TensorFlow's coordinated reads, and a
  setup that would fail, hang or give them unequal batches is refused (``lockstep``);
- the trials of a sweep (``trial=k``) read one shared job through TensorFlow's cross-trainer
  cache, so the workers compute each element once for all of them; a setup TensorFlow would refuse,
  or that would read wrongly, is refused before anything is sent (``sweep``);
- the element spec the trainer expects, checked before training starts;
- the servers' TensorFlow and ops, read from the dispatcher pod (``servercheck``): a pipeline
  the servers cannot run is refused before any element is requested, naming the missing op and
  the module to preload;
- ``iterate(dataset)``: the training loop's iterator, which measures data stalls and reports
  them to the dispatcher pod, and names the file behind a worker's bare ``DataLossError``;
- ``StallCallback()``: the same report for Keras, ``model.fit(dataset, callbacks=[StallCallback()])``
  (``distribute`` ends the pipeline with the stage it measures with; see ``fit``).

TensorFlow is imported only when these functions are called: the operator never imports
this package. Importing it needs nothing beyond the standard library (google-crc32c only once a
corrupt file is looked for), so it also runs from a plain copy on any TensorFlow image.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tfdata_operator.client import fingerprint as fp
from tfdata_operator.client import fit, servercheck, sweep
from tfdata_operator.client import lockstep as lockstep_
from tfdata_operator.client.claim import CLAIM_PREFIX as CLAIM_PREFIX  # the package's names stay
from tfdata_operator.client.claim import Claim, claim_job
from tfdata_operator.client.lockstep import LockstepError
from tfdata_operator.client.pipeline import (
    dataset_fingerprint,
    describe_spec,
    graph_def,
    input_files,
    remember_input_files,
)
from tfdata_operator.client.servercheck import (
    IncompatibleTensorFlowError,
    MissingOpError,
    ServerCheckError,
    ServerCheckSkippedWarning,
    TensorFlowVersionWarning,
)
from tfdata_operator.client.stall import INTERVAL_SECONDS, StallMeter
from tfdata_operator.client.sweep import SweepError
from tfdata_operator.wire import discovery
from tfdata_operator.wire.discovery import ClientSettings, DiscoveryError

if TYPE_CHECKING:
    import tensorflow as tf

ON_MISMATCH = ("error", "separate")
_CORRUPT = re.compile(r"(?:truncated|corrupted) record at (\d+)")


class ProcessingModeError(ValueError):
    """An explicit processing mode that contradicts the service's sharding policy."""


class PipelineMismatchError(RuntimeError):
    """Another trainer on the same job built a different pipeline."""


class ElementSpecMismatchError(TypeError):
    """The job produces elements of another type or shape than this trainer expects."""


class LocalReadsWarning(UserWarning):
    """A static sharding policy whose local-reads requirement does not hold."""


_last: dict[str, Any] = {}


def resolve(
    name: str | None,
    address: str | None,
    sharding_policy: str | None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> ClientSettings:
    """The settings to read with: explicit ones, or those published for ``name``."""
    if address is None:
        if sharding_policy is not None:
            raise DiscoveryError("sharding_policy= needs address= too (or neither: both are then discovered)")
        return discovery.load(name, environ, directory)
    if sharding_policy is None:
        raise DiscoveryError("address= needs sharding_policy= too: the service's spec.shardingPolicy")
    policy = discovery.normalize_mode(str(getattr(sharding_policy, "name", sharding_policy)))
    settings = ClientSettings(address=address, sharding_policy=policy, processing_mode=policy, service_name=name)
    settings.validate()
    return settings


def check_processing_mode(settings: ClientSettings, processing_mode: Any) -> str:
    """The processing mode to use: the one the service needs; an explicit other one is an error."""
    needed = settings.processing_mode
    if processing_mode is None:
        return needed
    given = discovery.normalize_mode(str(getattr(processing_mode, "name", processing_mode)))
    if given == needed:
        return needed
    service = f"service {settings.service_name!r}" if settings.service_name else f"the service at {settings.address}"
    why = {
        "OFF": "every worker would produce the whole dataset, so each element would arrive once per worker",
        "DYNAMIC": "the service was set up for static shards, and DYNAMIC would ignore them",
    }.get(given, "a static policy needs a dispatcher started with the worker list, which this service does not have")
    raise ProcessingModeError(
        f"{service} shards with {settings.sharding_policy}, but processing_mode={given} was given: {why}. "
        f"Use processing_mode=tf.data.experimental.service.ShardingPolicy.{needed}, or leave processing_mode "
        "out and distribute() uses it"
    )


def warn_local_reads(settings: ClientSettings, target_workers: str) -> None:
    if settings.is_static and target_workers.upper() != "LOCAL":
        warnings.warn(
            LocalReadsWarning(
                f"{settings.sharding_policy} is a static sharding policy: TensorFlow documents that each client "
                "should then read only from its local tf.data worker (target_workers='LOCAL', a worker in the "
                "trainer's own process), which never holds for workers in their own pods. This trainer reads from "
                "all workers: every shard is still read once per job, but which trainer gets which shard is not "
                "fixed. If your training needs a fixed shard per trainer, run a worker inside each trainer; "
                "otherwise use DYNAMIC"
            ),
            stacklevel=3,
        )


def check_element_spec(expected: Any, actual: Any, where: str) -> None:
    import tensorflow as tf

    try:
        tf.nest.assert_same_structure(expected, actual)
        compatible = all(
            e.is_compatible_with(a) for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(actual), strict=True)
        )
    except (TypeError, ValueError):
        compatible = False
    if not compatible:
        raise ElementSpecMismatchError(
            f"{where} produces {describe_spec(actual)}, but this trainer expects {describe_spec(expected)}: "
            "fix the pipeline or the expected element_spec before training"
        )


def distribute(
    name: str | None = None,
    *,
    address: str | None = None,
    sharding_policy: Any = None,
    processing_mode: Any = None,
    job_name: str | None = None,
    on_mismatch: str = "error",
    element_spec: Any = None,
    target_workers: str = "AUTO",
    check_servers: bool = True,
    server_info_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
    lockstep: bool | None = None,
    consumer_index: int | None = None,
    num_consumers: int | None = None,
    trial: int | str | None = None,
    **distribute_kwargs: Any,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """``dataset.apply(distribute("imagenet", job_name="train"))``: read ``dataset`` through a TFDataService.

    ``name`` picks the published settings (environment or mounted ConfigMap); or pass
    ``address`` and ``sharding_policy`` instead. ``processing_mode`` may be left out (the one the
    service needs is used); a contradicting one raises ``ProcessingModeError``. With
    ``job_name``, trainers whose pipelines differ are refused (``PipelineMismatchError``,
    ``ElementSpecMismatchError``); ``on_mismatch="separate"`` gives such a trainer a job of its
    own (``<job_name>-<fingerprint>``) instead. ``element_spec`` is what the trainer expects to
    receive, checked before training. Before anything is sent, the servers' ServerInfo
    (``server_info_url``, published with the settings) is read and a pipeline they cannot run is
    refused (``MissingOpError``, ``IncompatibleTensorFlowError``); ``check_servers=False`` skips
    that. Other keyword arguments go to TensorFlow's ``distribute``.

    Many trainers of one synchronous job (``lockstep``): when ``TF_CONFIG`` names more than one training task
    (chief and workers), or ``consumer_index`` and ``num_consumers`` are given, the trainers read the shared
    ``job_name`` with TensorFlow's coordinated reads, so that every trainer gets one element per round; the
    dataset must then be infinite (``.repeat()``; bound epochs with ``steps_per_epoch``), and each trainer's
    batches after the read end with the training (``.take(epochs * steps_per_epoch)``). A setup that would
    fail or give the trainers unequal work raises ``LockstepError`` saying what to change. ``lockstep=False``
    reads first-come-first-served instead; ``lockstep=True`` requires a place. See ``lockstep``.

    Trials of a sweep that share one preprocessing (``trial``): with ``trial=k`` (a number or a
    name) and the same ``job_name`` in every trial, each trial reads the whole stream of the shared
    job through TensorFlow's cross-trainer cache (``CrossTrainerCache(trainer_id="trial-<k>")``),
    and the workers compute each element once for all trials. The dataset must be infinite
    (``.repeat()``); a setup TensorFlow would refuse raises ``SweepError`` saying what to change.
    See ``sweep``.
    """
    _check_on_mismatch(on_mismatch)
    settings, mode = _settings(name, address, sharding_policy, processing_mode, environ, directory, server_info_url)
    protocol = distribute_kwargs.pop("data_transfer_protocol", settings.data_transfer_protocol)
    where = lockstep_.place(consumer_index, num_consumers, None if lockstep is False else _tf_config(environ))

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        read_plan, tf_kwargs = _read_plan(dataset, where, trial, job_name, lockstep, target_workers, distribute_kwargs)
        warn_local_reads(settings, target_workers)
        job = _claim(settings, dataset, job_name, on_mismatch, element_spec, check_servers)
        return _read(dataset, settings, mode, protocol, job, target_workers, read_plan, tf_kwargs)

    return apply


def _check_on_mismatch(on_mismatch: str) -> None:
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, got {on_mismatch!r}")


def _settings(
    name: str | None,
    address: str | None,
    sharding_policy: Any,
    processing_mode: Any,
    environ: Mapping[str, str] | None,
    directory: str | None,
    server_info_url: str | None,
) -> tuple[ClientSettings, str]:
    """``resolve``'s settings (with ``server_info_url`` when one is given), and the processing mode they need."""
    settings = resolve(name, address, sharding_policy, environ, directory)
    if server_info_url is not None:
        settings = dataclasses.replace(settings, server_info_url=server_info_url)
    return settings, check_processing_mode(settings, processing_mode)


def _tf_config(environ: Mapping[str, str] | None) -> str | None:
    return (os.environ if environ is None else environ).get("TF_CONFIG")


def _read_plan(
    dataset: tf.data.Dataset,
    where: lockstep_.Place | None,
    trial: int | str | None,
    job_name: str | None,
    lockstep: bool | None,
    target_workers: str,
    distribute_kwargs: Mapping[str, Any],
) -> tuple[lockstep_.Read, dict[str, Any]]:
    """How this trainer reads (in lockstep, as a trial of a sweep, or first-come-first-served), and the
    keyword arguments for TensorFlow's ``distribute`` (with the trial's cross-trainer cache)."""
    import tensorflow as tf

    cardinality = _cardinality(dataset)
    cache = distribute_kwargs.get("cross_trainer_cache") is not None
    trainer_id = sweep.plan(
        trial, job_name=job_name, cardinality=cardinality, where=where, lockstep=lockstep, cross_trainer_cache=cache
    )
    read_plan = lockstep_.plan(
        where,
        lockstep=lockstep,
        job_name=job_name,
        cardinality=cardinality,
        target_workers=target_workers,
        cross_trainer_cache=cache or trainer_id is not None,
    )
    tf_kwargs = dict(distribute_kwargs)
    if trainer_id is not None:
        tf_kwargs["cross_trainer_cache"] = tf.data.experimental.service.CrossTrainerCache(trainer_id)
    return read_plan, tf_kwargs


def _claim(
    settings: ClientSettings,
    dataset: tf.data.Dataset,
    job_name: str | None,
    on_mismatch: str,
    element_spec: Any,
    check_servers: bool,
) -> str | None:
    """The job to read, once the servers can run the pipeline: ``job_name`` claimed for this pipeline
    (or a job of its own, ``on_mismatch="separate"``), its element spec checked; remembered for ``iterate``."""
    graph = graph_def(dataset)
    if check_servers:
        servercheck.check_servers(graph, settings)
    remember_input_files(graph)
    job = job_name
    if job_name is not None:
        job = _join_job(settings, job_name, dataset, fp.fingerprint(graph), on_mismatch)
    if element_spec is not None:
        check_element_spec(element_spec, dataset.element_spec, f"job {job!r}" if job else "the pipeline")
    _last.update(settings=settings, job_name=job)
    return job


def _read(
    dataset: tf.data.Dataset,
    settings: ClientSettings,
    mode: str,
    protocol: Any,
    job: str | None,
    target_workers: str,
    read_plan: lockstep_.Read,
    tf_kwargs: Mapping[str, Any],
) -> tf.data.Dataset:
    """``dataset`` read through the service, ending with the stage ``StallCallback`` measures a Keras fit with."""
    import tensorflow as tf

    read = dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy[mode],
            service=settings.address,
            job_name=job,
            data_transfer_protocol=protocol,
            target_workers=target_workers,
            **read_plan.kwargs(),
            **tf_kwargs,
        )
    )
    return fit.stamp_waits(read)


def _cardinality(dataset: tf.data.Dataset) -> int:
    import tensorflow as tf

    value = tf.get_static_value(dataset.cardinality())
    return lockstep_.UNKNOWN if value is None else int(value)


def _join_job(
    settings: ClientSettings, job_name: str, dataset: tf.data.Dataset, ours: fp.Fingerprint, on_mismatch: str
) -> str:
    mine = Claim(ours.digest, describe_spec(dataset.element_spec), ours.transformations)
    held = claim_job(settings.address, job_name, mine)
    if held.fingerprint == mine.fingerprint:
        return job_name
    if on_mismatch == "separate":
        own = f"{job_name}-{ours.short}"
        claim_job(settings.address, own, mine)
        return own
    if held.element_spec != mine.element_spec:
        raise ElementSpecMismatchError(
            f"job {job_name!r} produces {held.element_spec} (pipeline {held.fingerprint[:16]}), but this trainer's "
            f"pipeline produces {mine.element_spec} (pipeline {ours.short}): its elements would not fit this "
            "model. Build the same pipeline as the other trainers, or use another job_name "
            "(or on_mismatch='separate')"
        )
    where = fp.difference(ours.transformations, held.transformations)
    raise PipelineMismatchError(
        f"job {job_name!r} was started by a trainer whose pipeline has fingerprint {held.fingerprint[:16]}; this "
        f"trainer's pipeline has fingerprint {ours.short}: {where}. Sharing the job would silently give this "
        "trainer the other pipeline's elements. Build the same pipeline as the other trainers; or, if the "
        "pipeline changed on purpose, use a new job_name (a job name stays bound to its first pipeline while "
        "the dispatcher keeps its state), or pass on_mismatch='separate' for a job of its own"
    )


def iterate(
    dataset: Iterable[Any],
    name: str | None = None,
    *,
    report_url: str | None = None,
    job_name: str | None = None,
    interval: float = INTERVAL_SECONDS,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> StallMeter[Any]:
    """The training loop's iterator: ``for batch in iterate(dataset): ...``.

    Measures how long each ``next()`` waits and reports it to the dispatcher pod (the report URL
    of the service last distributed to, or the one published for ``name``); never fails because
    of a report. A worker's ``DataLossError`` is raised as ``CorruptRecordError`` naming the file.
    For Keras ``model.fit``, use ``StallCallback`` instead.
    """
    url, job = report_target(name, report_url, job_name, environ, directory)
    return StallMeter(dataset, url, job, interval, translate=name_corrupt_file)


def report_target(
    name: str | None,
    report_url: str | None,
    job_name: str | None,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
) -> tuple[str | None, str | None]:
    """Where stall reports go and the job they name: as given, else the service last distributed to or ``name``'s."""
    settings: ClientSettings | None = _last.get("settings")
    if report_url is None and (settings is None or (name and settings.service_name != name)):
        try:
            settings = discovery.load(name, environ, directory)
        except DiscoveryError:
            settings = None
    url = report_url or (settings.report_url if settings else None)
    return url, job_name or _last.get("job_name")


def name_corrupt_file(exc: Exception) -> Exception | None:
    """A worker's bare DataLossError as a CorruptRecordError that names the file, if one can be found."""
    import tensorflow as tf

    if not isinstance(exc, tf.errors.DataLossError) or isinstance(exc, corrupt_record_error()):
        return None
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    files = list(input_files)
    hint = f"check the input files with: verify-tfrecords {' '.join(files[:3]) or 'PATTERN...'}"
    if not files:
        text = f"a tf.data worker read a corrupt record, and this trainer cannot tell which file: {hint}"
    else:
        from tfdata_operator.wire import tfrecords

        bad = tfrecords.verify_files(files).bad
        match = _CORRUPT.search(message)
        at = int(match.group(1)) if match else None
        bad.sort(key=lambda r: r.bad_offset != at)  # the file whose bad record is where TensorFlow stopped first
        if bad:
            named = "; ".join(r.describe() for r in bad)
            text = f"a tf.data worker read a corrupt TFRecord file: {named}"
        else:
            text = f"a tf.data worker read a corrupt record, but the files this trainer sees are intact: {hint}"
    hint_skip = (
        "To skip bad records instead of failing, apply tf.data.experimental.ignore_errors() inside the pipeline "
        "(only if losing those records is acceptable)"
    )
    error: Exception = corrupt_record_error()(None, None, f"{text}. {hint_skip}. TensorFlow said: {message}")
    return error


_corrupt_class: list[type[Exception]] = []


def corrupt_record_error() -> type[Exception]:
    """``CorruptRecordError``: a ``tf.errors.DataLossError`` (created on first use, to import TensorFlow late)."""
    if not _corrupt_class:
        import tensorflow as tf

        _corrupt_class.append(type("CorruptRecordError", (tf.errors.DataLossError,), {"__module__": __name__}))
    return _corrupt_class[0]


def __getattr__(attr: str) -> Any:
    if attr == "CorruptRecordError":
        return corrupt_record_error()
    if attr == "StallCallback":
        return fit.stall_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = [
    "ElementSpecMismatchError",
    "IncompatibleTensorFlowError",
    "LocalReadsWarning",
    "LockstepError",
    "MissingOpError",
    "PipelineMismatchError",
    "ProcessingModeError",
    "ServerCheckError",
    "ServerCheckSkippedWarning",
    "SweepError",
    "TensorFlowVersionWarning",
    "dataset_fingerprint",
    "distribute",
    "iterate",
]
