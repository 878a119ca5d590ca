"""The dispatcher's StatefulSet: one pod, its server configuration, and its journal claim."""

from __future__ import annotations

from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.journal import add_journal_claim, journal_mounts
from tfdata_operator.render.names import DISPATCHER, dispatcher_name, dispatcher_pods_name, metadata, selector_labels
from tfdata_operator.render.pod import pod_template
from tfdata_operator.render.podconfig import dispatcher_config
from tfdata_operator.render.settings import BuildSettings, Manifest
from tfdata_operator.wire import serverconfig


def build_dispatcher_statefulset(
    svc: ServiceSpec, settings: BuildSettings, worker_count: int, journal: str | None = None
) -> Manifest:
    """One dispatcher pod; its journal claim comes from volumeClaimTemplates."""
    config = dispatcher_config(svc, settings, worker_count, journal)
    d = svc.dispatcher
    mounts = journal_mounts(svc)
    sts: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(svc, dispatcher_name(svc), DISPATCHER),
        "spec": {
            # Suspended: no pod, and the same template, so a resume replays the same journal.
            "replicas": 0 if svc.suspend else 1,
            "serviceName": dispatcher_pods_name(svc),
            "selector": {"matchLabels": selector_labels(svc, DISPATCHER)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": pod_template(
                svc, settings, DISPATCHER, d.pod, serverconfig.to_json(config), {"grpc": d.port}, d.health_port, mounts
            ),
        },
    }
    add_journal_claim(svc, sts["spec"])
    return sts
