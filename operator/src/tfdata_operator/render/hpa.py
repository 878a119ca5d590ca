"""The HorizontalPodAutoscaler of spec.autoscaling with ``metric: CPU``."""

from __future__ import annotations

from tfdata_operator.api.identity import API_VERSION, KIND
from tfdata_operator.api.spec import CPU_METRIC, ServiceSpec
from tfdata_operator.render.names import WORKER, metadata, workers_name
from tfdata_operator.render.settings import Manifest


def build_hpa(svc: ServiceSpec) -> Manifest | None:
    """A HorizontalPodAutoscaler on this TFDataService's scale subresource, for ``metric: CPU``.

    With ``metric: TFData`` the operator itself decides (``autoscaling.policy``): an HPA would fight it.
    """
    a = svc.autoscaling
    if a is None or a.metric != CPU_METRIC or svc.suspend:
        return None  # suspended: autoscaling is paused (it would scale on the metrics of no pods)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(svc, workers_name(svc), WORKER),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": svc.name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": a.target_cpu_utilization_percentage},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_window_seconds}},
        },
    }
