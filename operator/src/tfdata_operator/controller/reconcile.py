"""One level-based reconcile of a TFDataService: from what the watches observed, apply what differs, report.

The work queue (``workqueue.py``) calls ``reconcile`` with a snapshot of the watches' cache, so
observing costs no request. It converges from any starting point, repairs drift, and writes
nothing when nothing differs. An invalid spec, a name taken by an object the service does
not own, or a child the API server refuses changes no child: it only sets
``Ready=False`` with the reason and records a Warning event once.

It reads as its steps (``STEPS``), each a small function of one ``Run`` (``run.py``): observe,
validate, claim the snapshot directory (``validate.py``), follow the lifecycle (``lifecycle.py``),
take Kueue's admission into account (``kueue.py``), autoscale and hold changes that would break
readers (``decide.py``), plan the children, dry-run the changes and apply them (``apply.py``),
repair pods and replace pods on lost nodes (``repair.py``), delete what is no longer wanted
(``apply.py``), announce a hold and report the status (``report.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from tfdata_operator.controller.apply import apply, delete, dry_run, plan_children
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.decide import autoscale, hold_changes
from tfdata_operator.controller.interface import Api, Manifest, Observed, Outcome
from tfdata_operator.controller.kueue import follow_kueue
from tfdata_operator.controller.lifecycle import follow_lifecycle
from tfdata_operator.controller.readers import Readers
from tfdata_operator.controller.repair import repair_pods, replace_lost_pods
from tfdata_operator.controller.report import announce_hold, report_status
from tfdata_operator.controller.run import Run
from tfdata_operator.controller.validate import claim_snapshot_directory, validate
from tfdata_operator.plan import desired as plan


def reconcile(
    api: Api, config: OperatorConfig, body: Manifest, observed: Observed, readers: Readers | None = None
) -> Outcome:
    """Converges one TFDataService from ``observed``; the caller keeps one reconcile per service at a time.

    ``observe`` gathers what the cache holds, then each step of ``STEPS`` runs in order on the
    same ``Run``; a step that returns False has said why (the status, an Event) and ends the
    reconcile there.
    """
    if body["metadata"].get("deletionTimestamp"):
        return Outcome()  # ownerReferences let the garbage collector remove the children
    run = observe(api, config, body, observed, readers)
    for step in STEPS:
        if not step(run):
            break
    return run.outcome


def observe(api: Api, config: OperatorConfig, body: Manifest, observed: Observed, readers: Readers | None) -> Run:
    """The service's own children, as the watches' cache has them: no request."""
    children = observe_children(body, observed)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Run(api, config, body, observed, readers, children, now, live=dict(children.objects))


def observe_children(body: Manifest, observed: Observed) -> plan.Children:
    """The objects of ``observed`` that this service owns (by uid: not a namesake's), and its pods."""
    uid = body["metadata"]["uid"]
    owned = {k: v for k, v in observed.objects.items() if plan.owned_by(v, uid)}
    return plan.Children(name=body["metadata"]["name"], objects=owned, pods=observed.pods)


Step = Callable[[Run], bool]
# The reconcile, in order (after ``observe``): each step is a small function of the same ``Run``.
STEPS: tuple[Step, ...] = (
    validate,
    claim_snapshot_directory,
    follow_lifecycle,
    follow_kueue,
    autoscale,
    hold_changes,
    plan_children,
    dry_run,
    apply,
    repair_pods,
    replace_lost_pods,
    delete,
    announce_hold,
    report_status,
)
