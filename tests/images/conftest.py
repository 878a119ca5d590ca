"""Fixtures for the image tests: the images `make images` built, run with the real Docker.

The tests use the daemon and the docker CLI that images/docker-daemon.sh finds (it starts
nothing here: `make test-images` builds the images first, which starts the daemon when
needed). Tests fail, rather than skip, when the daemon or an image is missing.

The images' cluster fixtures (`cluster`, `kubectl`, `namespace`) come from tests/fixtures.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.docker import Docker, parse_env_lines, read_version

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def version() -> str:
    """The images' tag: the package version, as images/images.sh tags them."""
    return read_version(REPO / "operator" / "pyproject.toml")


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    found = subprocess.run(
        [str(REPO / "images" / "docker-daemon.sh"), "env"], capture_output=True, text=True, timeout=60, check=False
    )
    if found.returncode != 0:
        pytest.fail(f"no Docker daemon answers; `make images` starts one and builds the images.\n{found.stderr}")
    settings = parse_env_lines(found.stdout)
    env = {**os.environ, **settings}
    client = Docker(binary=settings["DOCKER"], env=env, session=str(os.getpid()))
    for session in client.sessions():
        if session.isdigit() and not Path(f"/proc/{session}").exists():
            client.remove_session(session)  # left by a session that died
    yield client
    client.remove_session(client.session)


def _image(docker: Docker, name: str) -> str:
    if docker.run("image", "inspect", name, check=False).returncode != 0:
        pytest.fail(f"image {name} is missing: build it with `make images`")
    return name


@pytest.fixture(scope="session")
def server_image(docker: Docker, version: str) -> str:
    return _image(docker, f"tfdata-server:{version}")


@pytest.fixture(scope="session")
def operator_image(docker: Docker, version: str) -> str:
    return _image(docker, f"tfdata-operator:{version}")
