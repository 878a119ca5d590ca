"""Whether the servers can run a trainer's pipeline, checked before any element is requested.

tf.data service ships the trainer's dataset graph to the workers, which run it with their own
TensorFlow. A graph that uses an op the servers never registered (a ``tensorflow_text`` op, a
custom op library) or that their TensorFlow cannot read fails only when a worker first tries to
produce an element, as an error in the trainer that names neither the op nor the fix. The
servers serve what they can run (``serverinfo.ServerInfo``) on the dispatcher pod's health port,
published to trainers as ``ClientSettings.server_info_url``; this module reads it and compares:

- every op the graph uses (its nodes and its function library's, where map and filter
  functions live) must be among the servers' ops, else ``MissingOpError`` says which module to
  preload and on which image;
- TensorFlow's GraphDef version rule (``serverinfo.compatibility``): refused is
  ``IncompatibleTensorFlowError``, warned a ``TensorFlowVersionWarning`` (once per reason).

A server that cannot be reached, or is older than the endpoint (404), skips the check with a
``ServerCheckSkippedWarning``: the check never stops a trainer that would have worked.
TensorFlow is imported only by ``trainer_versions``.
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable
from typing import Any

from tfdata_operator.wire import serverinfo
from tfdata_operator.wire.discovery import ClientSettings
from tfdata_operator.wire.serverinfo import GraphDefVersions, ServerInfo

log = logging.getLogger("tfdata_operator.client")
SERVER_INFO_TIMEOUT_SECONDS = 3.0

# Reasons already warned about in this process: a trainer that distributes many datasets hears each once.
_warned: set[str] = set()


class ServerCheckError(RuntimeError):
    """The servers cannot run this trainer's pipeline; the message says what to change."""


class MissingOpError(ServerCheckError):
    """The pipeline uses ops the servers' TensorFlow has not registered."""


class IncompatibleTensorFlowError(ServerCheckError):
    """The servers' TensorFlow cannot read the graphs this trainer's TensorFlow writes."""


class ServerCheckSkippedWarning(UserWarning):
    """The servers' ServerInfo could not be read, so the pipeline was sent unchecked."""


class TensorFlowVersionWarning(UserWarning):
    """The trainer's TensorFlow is newer than the servers'."""


def ops_in_graph(graph: Any) -> set[str]:
    """Every op a GraphDef uses: its nodes' and those of every function in its library.

    The library is flat (a function a function calls is in it too); a node whose op names a
    library function is a call, not an op the servers must have registered.
    """
    functions = {f.signature.name for f in graph.library.function}
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {n.op for n in nodes} - functions


def trainer_versions() -> tuple[str, GraphDefVersions]:
    """This process's TensorFlow version and GraphDef versions."""
    import tensorflow as tf

    versions = GraphDefVersions(
        producer=tf.version.GRAPH_DEF_VERSION,
        min_consumer=tf.version.GRAPH_DEF_VERSION_MIN_CONSUMER,
        min_producer=tf.version.GRAPH_DEF_VERSION_MIN_PRODUCER,
    )
    return tf.version.VERSION, versions


def fetch(url: str, timeout: float = SERVER_INFO_TIMEOUT_SECONDS) -> ServerInfo | None:
    """The servers' ServerInfo, or None with a ``ServerCheckSkippedWarning`` saying why it could not be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return serverinfo.from_json(response.read())
    except urllib.error.HTTPError as exc:
        why = {
            404: "404: the servers' tfdata-server is older than this helper and does not serve it",
            503: "503: the servers' TensorFlow has not started yet",
        }.get(exc.code, f"HTTP {exc.code}")
    # Refused, timed out, cut off, a malformed URL, or not a ServerInfo (ServerInfoError is a ValueError).
    except (OSError, http.client.HTTPException, ValueError) as exc:
        why = str(getattr(exc, "reason", None) or exc)
    warnings.warn(
        ServerCheckSkippedWarning(
            f"cannot read the servers' TensorFlow and ops from {url} ({why}): the check that they can run this "
            "pipeline was skipped"
        ),
        stacklevel=5,
    )
    return None


def service_label(settings: ClientSettings) -> str:
    if settings.service_name:
        return (
            f"TFDataService {settings.namespace}/{settings.service_name}"
            if settings.namespace
            else (f"TFDataService {settings.service_name}")
        )
    return f"the TFDataService at {settings.address}"


def check(used_ops: Iterable[str], trainer_tf: str, trainer: GraphDefVersions, info: ServerInfo, service: str) -> None:
    """Raises when servers described by ``info`` cannot run a graph of ``used_ops``; warns once when they may not."""
    verdict = serverinfo.compatibility(trainer, info.graph_def)
    versions = f"the servers run TensorFlow {info.tensorflow_version}, this trainer {trainer_tf}"
    if verdict.verdict == serverinfo.REFUSED:
        raise IncompatibleTensorFlowError(f"{service} cannot run this trainer's pipeline: {versions}; {verdict.reason}")
    # A server that listed no ops said nothing about them; only a list can lack one.
    missing = sorted(set(used_ops) - set(info.ops)) if info.ops else []
    if missing:
        message = missing_ops_message(missing, service, info.tensorflow_version, trainer_tf)
        if verdict.verdict == serverinfo.WARNED:
            message += f". Also, {verdict.reason}"
        raise MissingOpError(message)
    if verdict.verdict == serverinfo.WARNED and verdict.reason not in _warned:
        _warned.add(verdict.reason)
        warnings.warn(TensorFlowVersionWarning(f"{service}: {versions}: {verdict.reason}"), stacklevel=5)


def missing_ops_message(missing: list[str], service: str, servers_tf: str, trainer_tf: str) -> str:
    """Each missing op, the module that registers it when its name says so, and what to change on the service."""
    modules = {op: serverinfo.module_for_op(op) for op in missing}
    named = [f"{op} (registered by {module})" if module else op for op, module in modules.items()]
    fixes = [
        f"add {module} to spec.preload.modules of {service} and run it on an image that has {module} (spec.image)"
        for module in dict.fromkeys(m for m in modules.values() if m)
    ]
    unknown = [op for op, module in modules.items() if module is None]
    if unknown:
        fixes.append(
            f"for {', '.join(unknown)}: add what registers {'it' if len(unknown) == 1 else 'them'} to {service}, a "
            "Python module to spec.preload.modules or an op library to spec.preload.opLibraries, and run it on an "
            "image that has it (spec.image)"
            + (
                f"; if it is a TensorFlow op newer than {servers_tf}, run the servers on this trainer's "
                f"TensorFlow {trainer_tf} (spec.image)"
                if servers_tf != trainer_tf
                else ""
            )
        )
    ops = f"{len(missing)} op{'s' if len(missing) > 1 else ''}"
    return (
        f"{service}'s servers (TensorFlow {servers_tf}) lack {ops} this pipeline uses: {', '.join(named)}. "
        f"To fix: {'; '.join(fixes)}"
    )


def check_servers(graph: Any, settings: ClientSettings, timeout: float = SERVER_INFO_TIMEOUT_SECONDS) -> None:
    """Checks the servers published in ``settings`` can run ``graph`` (a dataset's GraphDef); see the module."""
    if not settings.server_info_url:
        log.info("The settings of %s name no server info URL: the servers were not checked", service_label(settings))
        return
    info = fetch(settings.server_info_url, timeout)
    if info is None:
        return
    trainer_tf, trainer = trainer_versions()
    check(ops_in_graph(graph), trainer_tf, trainer, info, service_label(settings))
