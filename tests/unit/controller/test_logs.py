"""The operator's log: kopf's retried request attempts are warnings; its last attempt stays an error."""

from __future__ import annotations

import inspect
import io
import logging

import kopf._cogs.clients.api as kopf_api

from tfdata_operator.controller import logs

from fixtures.manifests import API_VERSION

RETRIED = (
    f"Request attempt #1/9 failed; will retry: GET https://127.0.0.1:6443/apis/{API_VERSION}/tfdataservices"
    " -> APITooManyRequestsError('storage is (re)initializing')"
)
ESCALATED = "Request attempt #9/9 failed; escalating: GET https://127.0.0.1:6443/api/v1/pods -> APIForbiddenError()"


def _logged(name: str, level: int, message: str) -> str:
    root = logging.Logger("test-root")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(handler)
    logs.install(root)
    logs.install(root)  # twice: still one filter
    assert len(handler.filters) == 1
    root.handle(logging.LogRecord(name, level, __file__, 1, message, None, None))
    return stream.getvalue().strip()


def test_a_retried_request_attempt_is_a_warning() -> None:
    assert _logged("kopf._cogs.clients.watching", logging.ERROR, RETRIED) == f"WARNING {RETRIED}"


def test_the_last_attempt_and_other_errors_stay_errors() -> None:
    assert _logged("kopf._cogs.clients.watching", logging.ERROR, ESCALATED) == f"ERROR {ESCALATED}"
    assert _logged("kopf.objects", logging.ERROR, "Handler 'x' failed") == "ERROR Handler 'x' failed"
    # Not kopf's: the operator's own lines are never rewritten.
    assert _logged("tfdata_operator.controller.handlers", logging.ERROR, RETRIED) == f"ERROR {RETRIED}"


def test_kopf_still_words_its_retries_as_the_filter_expects() -> None:
    """A kopf release that rewords its retry line would put the ERROR lines back: this fails first."""
    source = inspect.getsource(kopf_api.request)
    assert 'logger.error(f"Request attempt {idx} ' + logs.RETRY_MARK in source
    assert "failed; escalating" in source
