"""``spec.autoscaling``: the bounds, the metric (TFData or CPU) and its targets, and how workers are removed.

The checks that need the rest of the spec (the sharding policy, the workers' CPU request, the
dispatcher's journal) are ``spec/checks.py``'s.
"""

from __future__ import annotations

from tfdata_operator.api.spec.reader import Reader
from tfdata_operator.api.spec.types import (
    AUTOSCALING_METRICS,
    CPU_METRIC,
    SCALE_DOWN_ALWAYS,
    SCALE_DOWN_MODES,
    SCALE_DOWN_WHEN_IDLE,
    AutoscalingSpec,
)


def parse_autoscaling(r: Reader) -> AutoscalingSpec:
    if not r.has("maxReplicas"):
        r.problems.append("spec.autoscaling.maxReplicas is required")
    d = AutoscalingSpec(max_replicas=1)
    max_replicas = r.integer("maxReplicas", None, 1, 1000)
    min_replicas = r.integer("minReplicas", d.min_replicas, 0, 1000)
    metric = r.enum("metric", AUTOSCALING_METRICS, d.metric) or d.metric
    target = r.integer("targetCPUUtilizationPercentage", d.target_cpu_utilization_percentage, 1, 100)
    stall_set = r.has("targetDataStallPercentage")
    stall = r.integer("targetDataStallPercentage", d.target_data_stall_percentage, 1, 100)
    scale_down = r.enum("scaleDown", SCALE_DOWN_MODES, None)
    window = r.integer("scaleDownStabilizationWindowSeconds", d.scale_down_stabilization_window_seconds, 0, 3600)
    r.finish()
    assert min_replicas is not None and target is not None and stall is not None and window is not None
    # No maxReplicas (missing or refused above) leaves nothing the user wrote to compare with.
    if max_replicas is not None and min_replicas > max_replicas:
        r.problems.append(f"spec.autoscaling.minReplicas ({min_replicas}) must not exceed maxReplicas ({max_replicas})")
    if metric == CPU_METRIC and scale_down == SCALE_DOWN_WHEN_IDLE:
        r.problems.append(
            "spec.autoscaling.scaleDown WhenIdle needs metric TFData: a CPU HorizontalPodAutoscaler removes "
            "workers while clients read. Remove scaleDown, set it to Always, or use metric TFData"
        )
    if metric == CPU_METRIC and min_replicas == 0:
        r.problems.append(
            "spec.autoscaling.minReplicas 0 (scale to zero) needs metric TFData: a HorizontalPodAutoscaler keeps "
            "at least one worker. Set minReplicas to 1 or more, or use metric TFData"
        )
    if metric == CPU_METRIC and stall_set:
        r.problems.append(
            "spec.autoscaling.targetDataStallPercentage is used only by metric TFData: remove it, or use metric TFData"
        )
    return AutoscalingSpec(
        max_replicas=max_replicas or d.max_replicas,  # the default only beside a problem: parse raises
        min_replicas=min_replicas,
        metric=metric,
        target_cpu_utilization_percentage=target,
        target_data_stall_percentage=stall,
        scale_down=scale_down or (SCALE_DOWN_ALWAYS if metric == CPU_METRIC else SCALE_DOWN_WHEN_IDLE),
        scale_down_stabilization_window_seconds=window,
    )
