"""What a dispatcher or worker can run, and whether a trainer's TensorFlow may talk to it.

The server program measures a ``ServerInfo`` in its TensorFlow process (after the
preloads) and serves it as JSON at ``INFO_PATH`` on the health port; the operator and the
trainer's helper read it back with ``from_json``. ``compatibility`` is TensorFlow's own
GraphDef version rule applied to a trainer and the servers, so the helper can refuse a
pair before any element is requested instead of failing mid-epoch.

Like ``serverconfig`` and ``signals``, this module imports neither TensorFlow nor the
Kubernetes client: the operator, the server program and the trainer all import it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# The health port's path of a server's ServerInfo (JSON).
INFO_PATH = "/serverinfo"

WORKS, WARNED, REFUSED = "works", "warned", "refused"

# Op name prefixes a library registers its ops under, and the Python module that loads them.
# Used to say which module to preload for a missing op; an op without a known prefix gets a
# generic hint.
OP_PREFIX_MODULES: dict[str, str] = {
    "TFText>": "tensorflow_text",
    "IO>": "tensorflow_io",
    "Addons>": "tensorflow_addons",
    "SentencepieceOp>": "tensorflow_text",
}


class ServerInfoError(ValueError):
    """A ServerInfo document that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class GraphDefVersions:
    """TensorFlow's GraphDef versions of one binary (``tf.version.GRAPH_DEF_VERSION*``).

    ``producer`` is the version it writes and reads; ``min_consumer`` the oldest binary that
    may read what it writes; ``min_producer`` the oldest producer whose graphs it still reads.
    """

    producer: int
    min_consumer: int
    min_producer: int


@dataclass(frozen=True)
class ServerInfo:
    """One server's TensorFlow, its GraphDef versions, what it preloaded and every op it knows."""

    tensorflow_version: str
    python_version: str
    graph_def: GraphDefVersions
    # The modules imported and op libraries loaded before the server started, as configured.
    preloaded: tuple[str, ...] = ()
    # Every op the server's TensorFlow has registered (after the preloads), sorted.
    ops: tuple[str, ...] = field(default=(), repr=False)
    # Ops the preloads registered (not in the binary before them), sorted.
    preloaded_ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Compatibility:
    verdict: str  # WORKS, WARNED or REFUSED
    reason: str


def to_json(info: ServerInfo) -> str:
    return json.dumps(asdict(info), sort_keys=True)


def from_json(text: str | bytes) -> ServerInfo:
    try:
        raw = json.loads(text)
        graph_def = raw["graph_def"]
        return ServerInfo(
            tensorflow_version=str(raw["tensorflow_version"]),
            python_version=str(raw["python_version"]),
            graph_def=GraphDefVersions(
                producer=int(graph_def["producer"]),
                min_consumer=int(graph_def["min_consumer"]),
                min_producer=int(graph_def["min_producer"]),
            ),
            preloaded=tuple(str(x) for x in raw.get("preloaded", ())),
            ops=tuple(str(x) for x in raw.get("ops", ())),
            preloaded_ops=tuple(str(x) for x in raw.get("preloaded_ops", ())),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerInfoError(f"not a server info document: {exc}") from exc


def compatibility(trainer: GraphDefVersions, servers: GraphDefVersions) -> Compatibility:
    """Whether servers may run graphs this trainer writes, by TensorFlow's GraphDef rules.

    TensorFlow refuses a graph when the reader's version is below the graph's
    ``min_consumer`` or the graph's producer is below the reader's ``min_producer``
    (``VerifyVersions`` in ``tensorflow/core/framework/versions.cc``): REFUSED. A trainer
    whose producer version is newer than the servers' may write ops or attributes added
    since, which the servers do not know (TensorFlow promises backward compatibility of
    graphs, not forward): WARNED; the op check still refuses ops the servers lack. A trainer
    as old as the servers, or older: WORKS.
    """
    if servers.producer < trainer.min_consumer:
        return Compatibility(
            REFUSED,
            f"the trainer's TensorFlow writes graphs that need GraphDef version {trainer.min_consumer} or newer "
            f"to read, and the servers' is {servers.producer}: run the servers on a TensorFlow at least as new "
            "as the trainer's (spec.image)",
        )
    if trainer.producer < servers.min_producer:
        return Compatibility(
            REFUSED,
            f"the servers' TensorFlow reads graphs of GraphDef version {servers.min_producer} or newer, and the "
            f"trainer's writes {trainer.producer}: run the trainer on a newer TensorFlow, or the servers on the "
            "trainer's (spec.image)",
        )
    if trainer.producer > servers.producer:
        return Compatibility(
            WARNED,
            f"the trainer's TensorFlow (GraphDef version {trainer.producer}) is newer than the servers' "
            f"({servers.producer}): ops and attributes added since are unknown to the servers; run the servers "
            "on the trainer's image (spec.image) to be safe",
        )
    return Compatibility(WORKS, f"the servers read GraphDef version {trainer.producer} graphs")


def module_for_op(op: str) -> str | None:
    """The Python module that registers ``op``, when its name says so."""
    for prefix, module in OP_PREFIX_MODULES.items():
        if op.startswith(prefix):
            return module
    return None


def as_dict(info: ServerInfo) -> dict[str, Any]:
    return asdict(info)
