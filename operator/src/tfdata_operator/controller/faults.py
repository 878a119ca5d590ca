"""Test-only fault injection: the operator process dies at a named point of a reconcile.

Tests set ``TFDATA_TEST_FAULT`` to one of ``POINTS`` to kill the operator between two named
steps, deterministically, and then prove that a new operator process recovers. With
``TFDATA_TEST_FAULT_ACTION=hang`` the reconcile stops there instead and the process keeps running
(its other threads too: the leader election keeps renewing), so that a test can kill it from
outside, mid-reconcile, with SIGKILL. Unset (as in every deployment), ``reached`` does nothing.
"""

from __future__ import annotations

import logging
import os
import threading

ENV = "TFDATA_TEST_FAULT"
# The exit code of a process that stopped at a fault point, so a test can tell it from a crash.
EXIT_CODE = 86
POINTS = {
    "after-dry-run": "every change passed the dry run; nothing is applied yet",
    "after-first-apply": "the first changed child is applied; the others and the status are not",
}
ACTION_ENV = "TFDATA_TEST_FAULT_ACTION"
ACTIONS = ("exit", "hang")
_armed = os.environ.get(ENV) or None
if _armed is not None and _armed not in POINTS:
    raise SystemExit(f"{ENV}={_armed!r} names no fault point; use one of {', '.join(POINTS)}")
_action = os.environ.get(ACTION_ENV) or "exit"
if _action not in ACTIONS:
    raise SystemExit(f"{ACTION_ENV}={_action!r} names no fault action; use one of {', '.join(ACTIONS)}")


def reached(point: str) -> None:
    assert point in POINTS, point
    if point == _armed and _action == "hang":
        logging.getLogger(__name__).warning("Fault point %s reached: this reconcile hangs (%s)", point, ACTION_ENV)
        threading.Event().wait()
    if point == _armed:
        logging.getLogger(__name__).warning("Fault point %s reached: exiting with %d (%s)", point, EXIT_CODE, ENV)
        logging.shutdown()
        os._exit(EXIT_CODE)
