"""What the operator publishes for trainers: one typed model for the writer and the reader.

For each TFDataService the operator writes a ConfigMap ``<name>-client`` (see
``builders.build_client_configmap``) whose keys are the names in ``KEYS``. A trainer pod
gets them as environment variables with ``envFrom`` or as files by mounting the ConfigMap
(each key is a file of the same name), and ``tfdata_operator.client`` reads them back with
``load``. Both sides use this module, so the names cannot drift apart.

Like ``serverconfig`` and ``signals``, this module imports neither TensorFlow nor the
Kubernetes client: the operator and the trainer both import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from tfdata_operator.wire.sharding import SHARDING_POLICIES, STATIC_POLICIES

# Where a mounted ConfigMap is looked for: ``<DEFAULT_DIR>/<service name>``, then ``DEFAULT_DIR``.
DEFAULT_DIR = "/etc/tfdata"
# Overrides DEFAULT_DIR.
DIR_ENV = "TFDATA_CLIENT_DIR"
# TensorFlow's older names for the two dynamic processing modes.
_LEGACY_MODES = {"parallel_epochs": "OFF", "distributed_epoch": "DYNAMIC"}


class DiscoveryError(ValueError):
    """The published settings cannot be found or used; the message says what to fix."""


@dataclass(frozen=True)
class ClientSettings:
    """How a trainer reads from one TFDataService.

    ``processing_mode`` names the ``tf.data.experimental.service.ShardingPolicy`` a trainer
    must pass to ``distribute``; it is the service's sharding policy, since TensorFlow's
    dispatcher shards the way the client asks and the operator set the service up for one
    policy (a static policy's dispatcher got a worker list, a DYNAMIC one did not).
    """

    address: str
    sharding_policy: str
    processing_mode: str
    service_name: str | None = None
    namespace: str | None = None
    data_transfer_protocol: str | None = None
    # Where a trainer POSTs its data-stall report (signals.ClientReport).
    report_url: str | None = None
    # Where a trainer reads the servers' ServerInfo (serverinfo.INFO_PATH): their TensorFlow and ops.
    server_info_url: str | None = None
    # What the servers reported there, once the dispatcher has (status.server): their TensorFlow,
    # its GraphDef version and the ops the preloads registered (comma-separated). The whole op list
    # stays at server_info_url, which is always the running servers' (these are read at pod start).
    server_tensorflow: str | None = None
    server_graph_def_version: str | None = None
    server_preloaded_ops: str | None = None
    # Where ``client.snapshots`` keeps tf.data distributed snapshots: ``<snapshot_dir>/<name>``, a
    # directory every worker and trainer reaches by the same path, on a file system with atomic
    # rename (gs://, a ReadWriteMany volume). Published with spec.snapshots.directory.
    snapshot_dir: str | None = None
    # Where a trainer reads snapshot progress (snapshots.SNAPSHOTS_PATH on the dispatcher pod's health
    # port). Published with spec.snapshots; without it the client derives it from report_url, the same port.
    snapshots_url: str | None = None

    @property
    def is_static(self) -> bool:
        return self.sharding_policy in STATIC_POLICIES

    def validate(self) -> None:
        if not self.address:
            raise DiscoveryError(f"{KEYS['address']} is empty: it must hold the dispatcher's address")
        if self.sharding_policy not in SHARDING_POLICIES:
            raise DiscoveryError(
                f"{KEYS['sharding_policy']} must be one of {', '.join(SHARDING_POLICIES)}, got {self.sharding_policy!r}"
            )
        needed = processing_mode_for(self.sharding_policy)
        if self.processing_mode != needed:
            raise DiscoveryError(
                f"{KEYS['processing_mode']} is {self.processing_mode!r}, but a service sharded with "
                f"{self.sharding_policy} needs {needed!r}"
            )


# One table: field -> the ConfigMap key, which is also the environment variable's name
# (envFrom) and the file's name (a ConfigMap volume).
KEYS: dict[str, str] = {
    "address": "TFDATA_SERVICE_ADDRESS",
    "sharding_policy": "TFDATA_SHARDING_POLICY",
    "processing_mode": "TFDATA_PROCESSING_MODE",
    "service_name": "TFDATA_SERVICE_NAME",
    "namespace": "TFDATA_SERVICE_NAMESPACE",
    "data_transfer_protocol": "TFDATA_DATA_TRANSFER_PROTOCOL",
    "report_url": "TFDATA_REPORT_URL",
    "server_info_url": "TFDATA_SERVER_INFO_URL",
    "server_tensorflow": "TFDATA_SERVER_TENSORFLOW",
    "server_graph_def_version": "TFDATA_SERVER_GRAPH_DEF_VERSION",
    "server_preloaded_ops": "TFDATA_SERVER_PRELOADED_OPS",
    "snapshot_dir": "TFDATA_SNAPSHOT_DIR",
    "snapshots_url": "TFDATA_SNAPSHOTS_URL",
}
assert set(KEYS) == {f.name for f in fields(ClientSettings)}


def processing_mode_for(sharding_policy: str) -> str:
    """The ShardingPolicy name a client must use with a service sharded with ``sharding_policy``."""
    if sharding_policy not in SHARDING_POLICIES:
        raise DiscoveryError(f"unknown sharding policy {sharding_policy!r}: use one of {', '.join(SHARDING_POLICIES)}")
    return sharding_policy


def normalize_mode(mode: str) -> str:
    """A processing mode as a ShardingPolicy name; accepts TensorFlow's legacy strings."""
    name = _LEGACY_MODES.get(mode, mode.upper().removeprefix("SHARDINGPOLICY."))
    if name not in SHARDING_POLICIES:
        raise DiscoveryError(
            f"unknown processing mode {mode!r}: use a tf.data.experimental.service.ShardingPolicy "
            f"({', '.join(SHARDING_POLICIES)}) or 'parallel_epochs'/'distributed_epoch'"
        )
    return name


def to_data(settings: ClientSettings) -> dict[str, str]:
    """The ConfigMap's data: every set field under its key."""
    settings.validate()
    return {key: value for name, key in KEYS.items() if (value := getattr(settings, name)) is not None}


def from_data(data: Mapping[str, str], where: str) -> ClientSettings:
    """Settings from a mapping of keys (an environment, or a directory's files); ``where`` names it."""
    values = {name: data[key].strip() for name, key in KEYS.items() if data.get(key, "").strip()}
    missing = [KEYS[n] for n in ("address", "sharding_policy") if n not in values]
    if missing:
        raise DiscoveryError(f"{where} lacks {', '.join(missing)}")
    # Settings written by hand may leave out the mode: it follows from the policy.
    values.setdefault("processing_mode", values["sharding_policy"])
    settings = ClientSettings(**values)
    try:
        settings.validate()
    except DiscoveryError as exc:
        raise DiscoveryError(f"{where}: {exc}") from exc
    return settings


def read_dir(directory: Path) -> dict[str, str]:
    """The keys present as files in a mounted ConfigMap's directory."""
    data = {}
    for key in KEYS.values():
        path = directory / key
        if path.is_file():
            data[key] = path.read_text(encoding="utf-8")
    return data


def load(
    name: str | None = None, environ: Mapping[str, str] | None = None, directory: str | Path | None = None
) -> ClientSettings:
    """The published settings of service ``name`` (any one service if None).

    Looks in the environment first (``envFrom``), then in a mounted ConfigMap at
    ``<dir>/<name>`` and ``<dir>``, where ``<dir>`` is ``directory``, ``$TFDATA_CLIENT_DIR``
    or ``/etc/tfdata``. Settings published for another service are skipped, never used.
    """
    env = os.environ if environ is None else environ
    base = Path(directory or env.get(DIR_ENV) or DEFAULT_DIR)
    candidates: list[tuple[str, Mapping[str, str]]] = [("the environment", env)]
    if name:
        candidates.append((str(base / name), read_dir(base / name)))
    candidates.append((str(base), read_dir(base)))
    seen = []
    for where, data in candidates:
        if not data.get(KEYS["address"], "").strip():
            continue
        published_for = data.get(KEYS["service_name"], "").strip()
        if name and published_for and published_for != name:
            seen.append(f"{where} is for service {published_for!r}")
            continue
        return from_data(data, where)
    wanted = f"service {name!r}" if name else "a TFDataService"
    found = f" ({'; '.join(seen)})" if seen else ""
    raise DiscoveryError(
        f"no published settings for {wanted}{found}: give the trainer pod the ConfigMap "
        f"'{name or '<service>'}-client' with envFrom, or mount it at {base / (name or '<service>')}, "
        "or pass address= and sharding_policy= explicitly"
    )
