"""How the operator's log reads: an ERROR line means something failed and stays failed.

kopf logs every failed attempt of a request it will retry at ERROR ("Request attempt #1/9
failed; will retry: ..."), such as the 429 "storage is (re)initializing" an API server answers
for a CRD installed a moment before the operator starts. The retry is kopf's and usually
succeeds; only its last attempt ("failed; escalating") is an error. ``RetriesAreWarnings`` logs
the others as warnings, so an operator's log with an ERROR line is one that needs a person.
"""

from __future__ import annotations

import logging

RETRY_MARK = "failed; will retry:"


class RetriesAreWarnings(logging.Filter):
    """Logs kopf's "Request attempt ... failed; will retry" lines at WARNING instead of ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.name.startswith("kopf."):
            message = record.getMessage()
            if message.startswith("Request attempt") and RETRY_MARK in message:
                record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def install(root: logging.Logger | None = None) -> None:
    """Puts the filter on every handler of the root logger (kopf.configure's among them): a
    logger's own filters do not apply to what its children log."""
    for handler in (root or logging.getLogger()).handlers:
        if not any(isinstance(f, RetriesAreWarnings) for f in handler.filters):
            handler.addFilter(RetriesAreWarnings())
