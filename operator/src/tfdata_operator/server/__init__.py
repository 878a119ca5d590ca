"""``tfdata-server``: the program that runs in the dispatcher and worker pods.

Two processes, because TensorFlow 2.21's ``start()`` holds the GIL for as long as it
blocks (a worker blocks until the dispatcher accepts it, a dispatcher until its journal
is replayed): while it does, no Python thread and no signal handler in that process runs.

- ``main`` is the supervisor, the container's PID 1. It never imports TensorFlow, so it
  always answers the probes (``health``) and SIGTERM, and it reports bad configuration fast.
- ``tfserver`` runs in a child process, starts TensorFlow's server and reports its readiness
  to the supervisor over a pipe. It, and the modules only it calls (``tfconfig``, ``tffiles``),
  are the only ones that import TensorFlow.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "tfdata-server"


def configure_logging() -> logging.Logger:
    """Plain one-line records on stderr, the same in both processes."""
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger
