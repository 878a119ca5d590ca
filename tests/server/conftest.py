"""The server tier's fixtures: the TensorFlow the servers run on, and launchers of ``tfdata-server``
processes (``tests/fixtures/servers.py``) that kill what they started when the test or the module ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures import servers
from fixtures.servers import Launch, ServerTensorFlow


@pytest.fixture(scope="module")
def server_tf(tmp_path_factory: pytest.TempPathFactory) -> ServerTensorFlow:
    """The TensorFlow the servers and clients run on (tests/fixtures/servers.py)."""
    found = servers.server_tensorflow(tmp_path_factory.mktemp("opt-tfdata"))
    if not Path(found.server_command("worker")[0]).exists():
        pytest.fail(f"{found.server_command('worker')[0]} is missing: install the operator package (make venv)")
    return found


@pytest.fixture(scope="module")
def oldest(tmp_path_factory: pytest.TempPathFactory) -> ServerTensorFlow:
    """The server program injected into the TensorFlow 2.16 image stand-in (tests/fixtures/servers.py)."""
    try:
        return servers.injected_on(servers.OLDEST_PYTHON, tmp_path_factory.mktemp("opt-tfdata"))
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def launch(tmp_path_factory: pytest.TempPathFactory, server_tf: ServerTensorFlow) -> Iterator[Launch]:
    yield from servers.launcher(tmp_path_factory, server_tf)


@pytest.fixture(scope="module")
def module_launch(tmp_path_factory: pytest.TempPathFactory, server_tf: ServerTensorFlow) -> Iterator[Launch]:
    yield from servers.launcher(tmp_path_factory, server_tf)
