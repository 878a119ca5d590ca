"""The ``tfdata-operator`` command: ``run`` the operator, ``render`` a TFDataService offline, ``verify-tfrecords``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import click
import yaml

from tfdata_operator import __version__
from tfdata_operator.api import spec
from tfdata_operator.api.identity import API_VERSION, KIND
from tfdata_operator.controller import election
from tfdata_operator.controller.config import ElectionConfig, ElectionError, OperatorConfig, Timing
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import drain
from tfdata_operator.render.builders import DEFAULT_INJECTOR_IMAGE, BuildSettings
from tfdata_operator.wire import verify

DEFAULT_SERVER_IMAGE = f"tfdata-server:{__version__}"
RENDER_UID = "00000000-0000-0000-0000-000000000000"


@click.group()
@click.version_option(__version__, prog_name="tfdata-operator")
def main() -> None:
    """Runs TensorFlow's tf.data service on Kubernetes from TFDataService resources."""


@main.command()
@click.option(
    "--namespace", "namespaces", multiple=True, envvar="TFDATA_NAMESPACES",
    help="Watch only this namespace (repeatable; env TFDATA_NAMESPACES, space-separated). Default: all.",
)  # fmt: skip
@click.option(
    "--server-image", default=DEFAULT_SERVER_IMAGE, envvar="TFDATA_SERVER_IMAGE", show_default=True,
    help="The image of dispatcher and worker pods whose TFDataService sets no spec.image.",
)  # fmt: skip
@click.option(
    "--injector-image", default=DEFAULT_INJECTOR_IMAGE, envvar="TFDATA_INJECTOR_IMAGE", show_default=True,
    help="The image whose init container copies the server program into pods that run an image of the "
    "user's (spec.serverProgram Injected): the operator's own.",
)  # fmt: skip
@click.option(
    "--cluster-domain", default="cluster.local", envvar="TFDATA_CLUSTER_DOMAIN", show_default=True,
    help="The cluster's DNS domain, used in dispatcher and worker addresses.",
)  # fmt: skip
@click.option(
    "--liveness", default=None, envvar="TFDATA_LIVENESS",
    help="Serve kopf's liveness probe at this URL, e.g. http://0.0.0.0:8080/healthz.",
)  # fmt: skip
@click.option(
    "--log-format", type=click.Choice(["plain", "full", "json"]), default="full", envvar="TFDATA_LOG_FORMAT",
    show_default=True, help="Log line format.",
)  # fmt: skip
@click.option(
    "--resync-seconds", type=click.FloatRange(min=1), default=60.0, envvar="TFDATA_RESYNC_SECONDS",
    show_default=True, help="Reconcile every TFDataService this often even when nothing changed.",
)  # fmt: skip
@click.option(
    "--concurrent-reconciles", type=click.IntRange(min=1, max=64), default=8, envvar="TFDATA_CONCURRENT_RECONCILES",
    show_default=True, help="How many TFDataServices are reconciled at once.",
)  # fmt: skip
@click.option(
    "--metrics-port", type=click.IntRange(min=0, max=65535), default=None, envvar="TFDATA_METRICS_PORT",
    help="Serve Prometheus metrics at http://<metrics-address>:<port>/metrics (0 picks a free port).",
)  # fmt: skip
@click.option(
    "--metrics-address", default="0.0.0.0", envvar="TFDATA_METRICS_ADDRESS", show_default=True,
    help="The address the metrics endpoint listens on.",
)  # fmt: skip
@click.option(
    "--leader-election/--no-leader-election", default=False, envvar="TFDATA_LEADER_ELECTION", show_default=True,
    help="Run as one of several replicas: reconcile only while holding a Lease, stand by (watching) otherwise.",
)  # fmt: skip
@click.option(
    "--leader-election-namespace", default=None, envvar="TFDATA_LEADER_ELECTION_NAMESPACE",
    help="The namespace of the Lease.  [default: the operator pod's namespace]",
)  # fmt: skip
@click.option(
    "--leader-election-lease", default="tfdata-operator", envvar="TFDATA_LEADER_ELECTION_LEASE", show_default=True,
    help="The name of the Lease the replicas elect their leader on.",
)  # fmt: skip
@click.option(
    "--lease-duration", type=click.IntRange(min=1), default=Timing.lease_duration,
    envvar="TFDATA_LEASE_DURATION", show_default=True,
    help="Seconds a standby waits after the leader's last renewal before it takes over.",
)  # fmt: skip
@click.option(
    "--renew-deadline", type=click.FloatRange(min=0, min_open=True), default=Timing.renew_deadline,
    envvar="TFDATA_RENEW_DEADLINE", show_default=True,
    help="Seconds the leader keeps trying to renew before it stops writing and exits (below --lease-duration).",
)  # fmt: skip
@click.option(
    "--retry-period", type=click.FloatRange(min=0, min_open=True), default=Timing.retry_period,
    envvar="TFDATA_RETRY_PERIOD", show_default=True,
    help="Seconds between two tries to take or renew the Lease.",
)  # fmt: skip
@click.option(
    "--operator-namespace", default=None, envvar="TFDATA_OPERATOR_NAMESPACE",
    help="The namespace of the operator's pod (the chart sets it): each service's NetworkPolicy admits the "
    "operator's requests from there to the servers' health ports (/v1/signals, /readyz). "
    "Unset when the operator runs outside the cluster.",
)  # fmt: skip
@click.option(
    "--operator-pod-labels", default="", envvar="TFDATA_OPERATOR_POD_LABELS",
    help="The labels of the operator's pod, as key=value,key=value (the chart sets them): with "
    "--operator-namespace, the NetworkPolicies admit only pods with these labels.",
)  # fmt: skip
@click.option(
    spec.ALLOW_HOST_PATH_FLAG, "allow_host_path", is_flag=True, envvar="TFDATA_ALLOW_HOST_PATH_VOLUMES",
    help="Accept hostPath volumes in spec.dispatcher.volumes and spec.workers.volumes. Off, a TFDataService "
    "with one is refused (Ready False, InvalidSpec): a hostPath gives whoever may create a TFDataService a "
    "directory of the node, so it is for clusters where only the node's administrators create them.",
)  # fmt: skip
@click.option(
    drain.CLUSTER_MAX_WAIT_FLAG, "drain_max_wait", type=click.IntRange(min=0, max=604_800),
    default=drain.CLUSTER_MAX_WAIT_SECONDS, envvar="TFDATA_DRAIN_MAX_WAIT_SECONDS", show_default=True,
    help="The longest any TFDataService holds a node's drain (its workers' PodDisruptionBudget at 0 while "
    "clients read, a snapshot is written, or its dispatcher cannot be read), whatever its spec says; then "
    "drains go ahead with a Warning Event. A service's spec.workers.rescaleMaxWaitSeconds can only make it "
    "shorter. 0: no bound, so one namespace's readers can hold node drains and upgrades as long as they read.",
)  # fmt: skip
@click.option(
    "--kueue", is_flag=True, envvar="TFDATA_KUEUE",
    help="Admit TFDataServices labelled kueue.x-k8s.io/queue-name through Kueue (v0.19 or later), each as one "
    "Workload the operator writes: no pod runs before Kueue admits it, an eviction suspends it (journal "
    "kept). Needs Kueue installed, and the chart's kueue.enabled for the permissions (docs/training-runs.md).",
)  # fmt: skip
@click.option("--verbose", is_flag=True, envvar="TFDATA_VERBOSE", help="Log debug messages.")
def run(
    namespaces: tuple[str, ...],
    server_image: str,
    injector_image: str,
    cluster_domain: str,
    liveness: str | None,
    log_format: str,
    resync_seconds: float,
    concurrent_reconciles: int,
    metrics_port: int | None,
    metrics_address: str,
    leader_election: bool,
    leader_election_namespace: str | None,
    leader_election_lease: str,
    lease_duration: int,
    renew_deadline: float,
    retry_period: float,
    operator_namespace: str | None,
    operator_pod_labels: str,
    allow_host_path: bool,
    drain_max_wait: int,
    kueue: bool,
    verbose: bool,
) -> None:
    """Runs the operator until SIGTERM or SIGINT."""
    watched = [n for item in namespaces for n in item.split() if n]
    config = OperatorConfig(
        server_image=server_image,
        build=BuildSettings(
            cluster_domain=cluster_domain,
            injector_image=injector_image,
            operator_namespace=operator_namespace or None,
            operator_pod_labels=parse_pod_labels(operator_pod_labels),
        ),
        namespaces=tuple(watched),
        allow_host_path=allow_host_path,
        drain_max_wait_seconds=drain_max_wait or None,
        kueue=kueue,
        resync_seconds=resync_seconds,
        concurrent_reconciles=concurrent_reconciles,
        election=election_config(
            leader_election,
            leader_election_namespace,
            leader_election_lease,
            (lease_duration, renew_deadline, retry_period),
        ),
    )
    _operate(config, liveness, log_format, metrics_port, metrics_address, verbose=verbose)


def _operate(
    config: OperatorConfig,
    liveness: str | None,
    log_format: str,
    metrics_port: int | None,
    metrics_address: str,
    *,
    verbose: bool,
) -> None:
    """``run``'s second half: set up logging and metrics, then run kopf with ``config`` until SIGTERM or SIGINT."""
    import asyncio
    import logging

    import kopf

    from tfdata_operator.controller import handlers, logs, memory

    kopf.configure(verbose=verbose, log_format=kopf.LogFormat[log_format.upper()])
    logs.install()
    if config.kueue:
        handlers.watch_workloads()
    memory.limit_malloc_arenas()
    if not verbose:
        # kopf logs every handler run; the operator logs what it changed.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if metrics_port is not None:
        import prometheus_client

        server, _ = prometheus_client.start_http_server(metrics_port, metrics_address)
        logging.getLogger(__name__).info("Serving metrics at http://%s:%d/metrics", metrics_address, server.server_port)
    asyncio.run(
        kopf.operator(
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            liveness_endpoint=liveness,
            # Never kopf's peering: it pauses every watch of a standby (a cold cache) and pauses both of
            # two replicas of the same priority. Replicas elect a leader on a Lease instead (election.py).
            standalone=True,
            memo=handlers.new_memo(config),
        )
    )


def election_config(
    enabled: bool, namespace: str | None, lease: str, timing: tuple[int, float, float]
) -> ElectionConfig | None:
    """The leader election's settings from ``run``'s options, or None without an election."""
    if not enabled:
        return None
    namespace = namespace or election.default_namespace()
    if not namespace:
        raise click.UsageError(
            "--leader-election needs --leader-election-namespace (or TFDATA_LEADER_ELECTION_NAMESPACE): "
            "outside a pod there is no namespace of the operator's own to put the Lease in"
        )
    try:
        durations = Timing(*timing)
    except ElectionError as exc:
        raise click.UsageError(f"--lease-duration, --renew-deadline, --retry-period: {exc}") from exc
    return ElectionConfig(namespace=namespace, name=lease, timing=durations)


@main.command()
@click.option("-f", "--filename", "path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A YAML file with one or more TFDataServices ('-' reads stdin).")  # fmt: skip
@click.option("--server-image", default=DEFAULT_SERVER_IMAGE, envvar="TFDATA_SERVER_IMAGE", show_default=True,
              help="The default server image, as the operator would be configured.")  # fmt: skip
@click.option("--injector-image", default=DEFAULT_INJECTOR_IMAGE, envvar="TFDATA_INJECTOR_IMAGE", show_default=True,
              help="The image that copies the server program into pods of an image of the user's.")  # fmt: skip
@click.option("--cluster-domain", default="cluster.local", envvar="TFDATA_CLUSTER_DOMAIN", show_default=True,
              help="The cluster's DNS domain.")  # fmt: skip
@click.option(spec.ALLOW_HOST_PATH_FLAG, "allow_host_path", is_flag=True, envvar="TFDATA_ALLOW_HOST_PATH_VOLUMES",
              help="Accept hostPath volumes, as an operator started with this flag does.")  # fmt: skip
def render(path: Path, server_image: str, injector_image: str, cluster_domain: str, allow_host_path: bool) -> None:
    """Prints the objects the operator would create for a new TFDataService, without a cluster.

    The output is built by the operator's own builder code. Owner references carry a
    placeholder uid, since only the API server assigns the real one.
    """
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror}") from exc
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path} is not valid YAML: {exc}") from exc
    if not documents:
        raise click.ClickException(f"{path} holds no TFDataService")
    rendered = []
    for index, doc in enumerate(documents):
        where = f"{path} (document {index + 1})" if len(documents) > 1 else str(path)
        rendered.extend(
            render_document(
                doc,
                where,
                server_image,
                BuildSettings(cluster_domain=cluster_domain, injector_image=injector_image),
                allow_host_path=allow_host_path,
            )
        )
    dump(rendered, sys.stdout)


main.add_command(verify.verify_tfrecords)


def render_document(
    doc: Any, where: str, server_image: str, settings: BuildSettings, *, allow_host_path: bool = False
) -> list[dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        found = f"{doc.get('apiVersion')}/{doc.get('kind')}" if isinstance(doc, dict) else type(doc).__name__
        raise click.ClickException(f"{where}: expected apiVersion {API_VERSION}, kind {KIND}; found {found}")
    body = {**doc, "metadata": {"namespace": "default", "uid": RENDER_UID, **(doc.get("metadata") or {})}}
    try:
        svc = spec.parse(body, server_image, allow_host_path=allow_host_path)
    except spec.SpecError as exc:
        raise click.ClickException(f"{where}: invalid spec: {exc}") from exc
    return plan.desired_children(svc, settings, plan.Children(svc.name)).apply


def dump(objects: list[dict[str, Any]], out: TextIO) -> None:
    out.write(yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=120))


__all__ = ["main", "render_document"]


def parse_pod_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``--operator-pod-labels``: ``key=value,key=value`` (empty: none), or a usage error saying what to fix."""
    pairs = [item.strip() for item in text.split(",") if item.strip()]
    malformed = [p for p in pairs if "=" not in p]
    labels = dict(p.split("=", 1) for p in pairs if "=" in p)
    bad_keys, bad_values = spec.invalid_labels(labels)
    if malformed or bad_keys or bad_values:
        wrong = [*malformed, *bad_keys, *(f"{k}={labels[k]}" for k in bad_values)]
        raise click.BadParameter(
            f"expected key=value,key=value with Kubernetes label keys and values; wrong: {', '.join(wrong)}",
            param_hint="--operator-pod-labels",
        )
    return tuple(sorted(labels.items()))
