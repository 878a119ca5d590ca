"""The checks ``tfdata-server`` makes on an image of the user's before it starts.

``inject``'s program runs ``main`` once the Python is new enough (it checks that itself, in syntax
any Python parses). Here: that the image has TensorFlow, and one new enough, told from the
installed distribution's metadata without importing TensorFlow (the supervisor never does). A
problem is one line on stderr saying what is wrong and what to change, and exit code
``EXIT_UNSUPPORTED_IMAGE``: the container's last log line is its termination message, which the
operator quotes. Then the server program runs as ``tfdata-server`` does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import sys
from collections.abc import Callable, Iterable

from tfdata_operator.wire import serverconfig

# The distributions TensorFlow is published as. Any other that installs the `tensorflow` package
# is found through importlib.metadata.packages_distributions(), which reads every distribution's
# file list, so it is asked only when none of these is installed.
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tensorflow-aarch64",
    "tensorflow-cpu-aws",
    "tensorflow-rocm",
    "tf-nightly",
    "tf-nightly-cpu",
    "tf-nightly-gpu",
    "tf-nightly-intel",
)


def version_tuple(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as 2.16.2, 2.17.0rc1 or 2.23.0.dev20261026."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def installed_tensorflow(
    version_of: Callable[[str], str | None], owners: Callable[[], Iterable[str]]
) -> tuple[str, str] | None:
    """(distribution, version) of the installed TensorFlow, None when no metadata says."""
    for names in (lambda: TENSORFLOW_DISTRIBUTIONS, owners):
        for name in names():
            version = version_of(name)
            if version:
                return name, version
    return None


def image_problem(
    has_tensorflow: bool,
    distribution: Callable[[], tuple[str, str] | None],
    oldest: tuple[int, int] = serverconfig.OLDEST_TENSORFLOW,
) -> str | None:
    """What stops this image from serving, and what to change; None when nothing does.

    A TensorFlow whose version no metadata tells is given its chance: the TensorFlow process
    says so if it cannot serve.
    """
    needed = f"the server program needs TensorFlow {oldest[0]}.{oldest[1]} or newer"
    if not has_tensorflow:
        return (
            f"this image has no TensorFlow (Python {platform.python_version()} at {sys.executable} finds no module "
            f"named tensorflow); {needed}: use an image with TensorFlow as spec.image"
        )
    found = distribution()
    if found is None:
        return None
    name, version = found
    parsed = version_tuple(version)
    if parsed is not None and parsed < oldest:
        change = "use an image with a newer TensorFlow as spec.image"
        return f"this image has TensorFlow {version} ({name}); {needed}: {change}"
    return None


def _version_of(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _owners_of_tensorflow() -> list[str]:
    return list(importlib.metadata.packages_distributions().get("tensorflow", []))


def main() -> None:
    problem = image_problem(
        importlib.util.find_spec("tensorflow") is not None,
        lambda: installed_tensorflow(_version_of, _owners_of_tensorflow),
    )
    if problem is not None:
        print(f"tfdata-server: {problem}", file=sys.stderr)
        sys.exit(serverconfig.EXIT_UNSUPPORTED_IMAGE)
    from tfdata_operator.server.main import main as server_main

    server_main(prog_name="tfdata-server")
