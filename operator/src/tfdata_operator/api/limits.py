"""The bounds the CRDs put on the status, and the one cut that keeps what the operator writes there within them.

Much of a status is text from elsewhere: a pod's HTTP reason phrase, its ``/serverinfo``, a
snapshot's TensorFlow error, Kubernetes' own messages. The API server refuses a whole status
patch with one string over its field's ``maxLength`` (422), and a status that cannot be written
stays as it was for good. So every status is ``fit`` to its kind's table before it is compared
or written, and every string in it is ``clip``-ped: control characters and terminal escapes
removed (they would reach ``kubectl describe``), whitespace flattened, and cut to its bound with
a visible mark. The tables are ``crds/``'s ``maxLength`` and ``maxItems``, field by field; a unit
test holds them equal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar, cast

_T = TypeVar("_T")

# What ends a cut text.
MARK = "…"

# ANSI/ECMA-48 escape sequences: CSI (colours, cursor moves), OSC (window titles, links) and
# the two-character ones.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
# C0 and C1 control characters and DEL, and the bidirectional overrides and isolates that make
# text read other than it is.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

# An Event's message, as Kubernetes' own recorders cut it (events.k8s.io's note is at most 1 kB).
EVENT_MESSAGE = 1024

# The bound of each field of a status, by path ("[]" for a list's items): ``maxLength`` for a
# string, ``maxItems`` for a list. Written as crds/ has them.
_CONDITIONS = {
    "conditions": 16,
    "conditions[].type": 316,
    "conditions[].lastTransitionTime": 64,
    "conditions[].reason": 1024,
    "conditions[].message": 32768,
}
SERVICE_STATUS: Mapping[str, int] = {
    **_CONDITIONS,
    "dispatcherAddress": 512,
    "workerAddresses": 1000,
    "workerAddresses[]": 512,
    "workers.summary": 32,
    "held.change": 64,
    "held.since": 64,
    "held.message": 4096,
    "drains.since": 64,
    "drains.unreadableSince": 64,
    "drains.message": 4096,
    "server.tensorflowVersion": 64,
    "server.pythonVersion": 64,
    "server.preloaded": 32,
    "server.preloaded[]": 1024,
    "server.preloadedOps": 64,
    "server.preloadedOps[]": 256,
    "server.pod": 128,
    "selector": 1024,
    "autoscaling.metric": 16,
    "autoscaling.reason": 4096,
    "autoscaling.observedTime": 64,
    "autoscaling.signals.jobs": 16,
    "autoscaling.signals.jobs[].name": 256,
    "autoscaling.signals.jobsNote": 256,
    "autoscaling.signals.error": 1024,
    "autoscaling.lastScale.time": 64,
    "autoscaling.lastScale.reason": 4096,
    "lifecycle.workload.apiVersion": 253,
    "lifecycle.workload.kind": 63,
    "lifecycle.workload.name": 253,
    "lifecycle.workload.uid": 64,
    "lifecycle.workload.condition": 64,
    "lifecycle.workload.finishedAt": 64,
    "lifecycle.workload.actedAt": 64,
    "lifecycle.workload.message": 1024,
    "lifecycle.nextAction.at": 64,
    "lifecycle.lastReadTime": 64,
    "lifecycle.readError": 1024,
    "kueue.workload": 253,
    "kueue.queue": 63,
    "kueue.state": 32,
    "kueue.since": 64,
    "kueue.message": 4096,
    "kueue.clusterQueue": 253,
}
SNAPSHOT_STATUS: Mapping[str, int] = {
    "reason": 128,
    "message": 4096,
    "path": 2048,
    "streams": 64,
    "error": 4096,
}


def clip(text: str, limit: int) -> str:
    """``text`` on one line, without control characters or escapes, in at most ``limit`` characters
    (the CRD's ``maxLength`` counts characters); a cut one ends with ``MARK``."""
    flat = " ".join(_CONTROLS.sub(" ", _ESCAPES.sub("", text)).split())
    return flat if len(flat) <= limit else flat[: limit - len(MARK)].rstrip() + MARK


def fit(value: _T, bounds: Mapping[str, int], at: str = "") -> _T:
    """``value`` (a whole status, or its block at path ``at``) with every string clipped and every
    list cut to its field's bound in ``bounds``; fields without one are left as they are."""
    fitted: Any = value
    if isinstance(value, str) and at in bounds:
        fitted = clip(value, bounds[at])
    elif isinstance(value, list):
        fitted = [fit(item, bounds, f"{at}[]") for item in value[: bounds.get(at)]]
    elif isinstance(value, Mapping):
        fitted = {key: fit(item, bounds, f"{at}.{key}" if at else key) for key, item in value.items()}
    return cast(_T, fitted)
