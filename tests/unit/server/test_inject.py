"""The server program for an image of the user's: what ``inject`` copies, and the checks its program
makes before anything runs (``bootstrap``), on made-up metadata."""

from __future__ import annotations

import ast
import json
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tfdata_operator.server import bootstrap, inject
from tfdata_operator.wire import serverconfig


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("opt-tfdata")
    assert inject.main([str(target)]) == 0
    return target


def relative_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_copies_the_server_program_and_its_pure_python_dependencies_only(injected: Path) -> None:
    files = relative_files(injected / inject.PYTHON_DIR)
    for expected in (
        "tfdata_operator/__init__.py",
        "tfdata_operator/server/main.py",
        "tfdata_operator/server/tfserver.py",
        "tfdata_operator/server/bootstrap.py",
        "tfdata_operator/wire/serverconfig.py",
        "tfdata_operator/wire/serverinfo.py",
        "click/core.py",
        "prometheus_client/__init__.py",
        "prometheus_client/parser.py",
    ):
        assert expected in files
    tops = {f.split("/")[0] for f in files}
    assert tops == {"tfdata_operator", "click", "prometheus_client"}
    subpackages = {f.split("/")[1] for f in files if f.startswith("tfdata_operator/") and f.count("/") > 1}
    assert subpackages == {"server", "wire", "client"}  # never the operator's controller, render, api, ...
    assert not [f for f in files if "__pycache__" in f or f.endswith((".pyc", ".pyo"))]


def test_every_file_is_readable_and_every_directory_searchable_by_anyone(injected: Path) -> None:
    for path in injected.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        wanted = 0o755 if path.is_dir() or path.name == inject.PROGRAM else 0o644
        assert mode == wanted, f"{path}: {oct(mode)}"
    assert (injected / inject.PROGRAM).read_text() == inject.launcher_source()
    assert Path(serverconfig.INJECTED_PROGRAM).name == inject.PROGRAM


def test_main_refuses_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inject.main([str(tmp_path / "missing")]) == 2
    assert "is not a directory (mount an emptyDir there)" in capsys.readouterr().err


def test_launcher_parses_as_python_3_4(injected: Path) -> None:
    # No f-strings, annotations or walrus: an old Python must reach the version check and print it.
    ast.parse(inject.launcher_source(), feature_version=(3, 4))


def test_launcher_on_a_python_older_than_needed_says_so_and_exits_3(tmp_path: Path) -> None:
    program = tmp_path / "tfdata-server"
    program.write_text(inject.launcher_source(oldest_python=(99, 0)))
    result = subprocess.run([sys.executable, str(program), "worker"], capture_output=True, text=True, timeout=30)
    assert result.returncode == serverconfig.EXIT_UNSUPPORTED_IMAGE
    version = ".".join(map(str, sys.version_info[:3]))
    assert result.stderr == (
        f"tfdata-server: this image has Python {version}; the server program needs Python 99.0 or newer: "
        "use an image with a newer Python as spec.image\n"
    )


# In place of the real bootstrap (tests/server runs that): where each module came from.
REPORTER = """\
import json, sys
import click, prometheus_client, tfdata_operator.wire.serverconfig
def main():
    names = ("tfdata_operator", "tfdata_operator.wire.serverconfig", "click", "prometheus_client")
    print(json.dumps({name: sys.modules[name].__file__ for name in names}))
"""


def test_the_program_loads_its_own_package_and_the_images_packages_first(injected: Path, tmp_path: Path) -> None:
    # This Python has the operator installed (an image with an older one), click and
    # prometheus_client; on its PYTHONPATH another tfdata_operator, imported at startup.
    program = tmp_path / "opt-tfdata"
    shutil.copytree(injected, program)
    (program / inject.PYTHON_DIR / "tfdata_operator" / "server" / "bootstrap.py").write_text(REPORTER)
    image = tmp_path / "image"
    for name, text in {
        "tfdata_operator/__init__.py": "",
        "tfdata_operator/wire/__init__.py": "",
        "tfdata_operator/wire/serverconfig.py": "",
        "sitecustomize.py": "import tfdata_operator.wire.serverconfig\n",
    }.items():
        (image / name).parent.mkdir(parents=True, exist_ok=True)
        (image / name).write_text(text)
    result = subprocess.run(
        [sys.executable, str(program / inject.PROGRAM), "worker"],
        env={"PYTHONPATH": str(image)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    ours = program / inject.PYTHON_DIR / "tfdata_operator"
    assert loaded["tfdata_operator"] == str(ours / "__init__.py")
    assert loaded["tfdata_operator.wire.serverconfig"] == str(ours / "wire" / "serverconfig.py")
    for dependency in inject.DEPENDENCIES:
        assert not loaded[dependency].startswith(str(program)), loaded  # the image's own


def versions(**installed: str) -> Callable[[str], str | None]:
    return lambda name: installed.get(name.replace("-", "_"))


@pytest.mark.parametrize(
    ("installed", "owners", "found"),
    [
        ({"tensorflow_cpu": "2.21.0"}, [], ("tensorflow-cpu", "2.21.0")),
        ({"tf_nightly": "2.23.0.dev20261026"}, [], ("tf-nightly", "2.23.0.dev20261026")),
        ({"tensorflow_rocm_custom": "2.16.1"}, ["tensorflow_rocm_custom"], ("tensorflow_rocm_custom", "2.16.1")),
        ({}, [], None),
    ],
    ids=["cpu", "nightly", "other-owner", "no-metadata"],
)
def test_installed_tensorflow_from_metadata(
    installed: dict[str, str], owners: list[str], found: tuple[str, str] | None
) -> None:
    assert bootstrap.installed_tensorflow(versions(**installed), lambda: owners) == found


def test_owners_are_asked_only_when_no_known_distribution_is_installed() -> None:
    def owners() -> list[str]:
        raise AssertionError("packages_distributions() reads every distribution's files")

    assert bootstrap.installed_tensorflow(versions(tensorflow="2.16.2"), owners) == ("tensorflow", "2.16.2")


@pytest.mark.parametrize(
    ("version", "ok"),
    [("2.16.0", True), ("2.16.0rc0", True), ("2.21.0", True), ("3.0.0", True), ("2.15.1", False), ("1.15.5", False)],
)
def test_tensorflow_older_than_the_oldest_is_refused_with_what_to_change(version: str, ok: bool) -> None:
    problem = bootstrap.image_problem(True, lambda: ("tensorflow", version), oldest=(2, 16))
    if ok:
        assert problem is None
    else:
        assert problem == (
            f"this image has TensorFlow {version} (tensorflow); the server program needs TensorFlow 2.16 or newer: "
            "use an image with a newer TensorFlow as spec.image"
        )


def test_no_tensorflow_is_refused_and_unknown_metadata_is_given_its_chance() -> None:
    problem = bootstrap.image_problem(False, lambda: None)
    assert problem is not None
    assert problem.startswith("this image has no TensorFlow (Python ")
    assert problem.endswith(
        "the server program needs TensorFlow 2.16 or newer: use an image with TensorFlow as spec.image"
    )
    assert bootstrap.image_problem(True, lambda: None) is None
    assert bootstrap.image_problem(True, lambda: ("tensorflow", "unknown")) is None


def test_bootstrap_on_a_python_without_tensorflow_exits_3_with_one_line(injected: Path) -> None:
    # -S: without site-packages this Python has no TensorFlow, as an image without it.
    result = subprocess.run(
        [sys.executable, "-S", str(injected / inject.PROGRAM), "dispatcher"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == serverconfig.EXIT_UNSUPPORTED_IMAGE, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("tfdata-server: this image has no TensorFlow"), result.stderr
