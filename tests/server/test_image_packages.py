"""The injected server program runs its own ``tfdata_operator``, whatever the user's image holds.

Each image is the TensorFlow 2.16 stand-in (``.venv-tf2.16``, nothing of ours, tests/fixtures/servers.py)
with packages of its own on its PYTHONPATH, as an image that installed them there:

- the trainer package (``tfdata-client``: a ``tfdata_operator`` with ``client`` and ``wire`` only),
  installed by pip from operator/client-dist as docs/trainers.md tells a team, with its
  dependencies (click among them);
- an older full operator package whose server program cannot serve (each of its modules exits
  saying it ran), already imported when the interpreter started (a ``sitecustomize``, as a
  ``.pth`` can): stale entries in ``sys.modules``;
- modules named like ours: a top-level ``tfdata_operator.py`` and a namespace package.

On each, a dispatcher and a worker started by the injected program must turn ready and serve
their /serverinfo from the image's TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tfdata_operator.wire import serverinfo
from tfdata_operator.wire.serverconfig import DispatcherServerConfig

from fixtures import servers
from fixtures.servers import Launch, ServerTensorFlow, free_port, worker_config

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = Path(os.environ.get("TFDATA_CACHE") or Path.home() / ".cache" / "tfdata-operator") / "wheels"
POD_NAME = "127.0.0.1"  # "{pod_name}:<port>" then announces a reachable address on this host
OLDER = "the image's older tfdata-operator ran"


def trainer_package(image: ServerTensorFlow, site: Path) -> list[Path]:
    """``pip install ./operator/client-dist`` into ``site``, from the wheels ``make venv`` keeps."""
    project = site.parent / "project"  # the build writes beside the package, not in the tree
    shutil.copytree(ROOT / "operator" / "client-dist", project / "client-dist", ignore=shutil.ignore_patterns("build"))
    (project / "src").symlink_to(ROOT / "operator" / "src")
    command = [str(image.python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELHOUSE),
               "--target", str(site), str(project / "client-dist")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"pip install failed (are the wheels in {WHEELHOUSE}? make venv):\n{done.stderr}"
    assert (site / "click").is_dir(), sorted(p.name for p in site.iterdir())  # the image's own click
    return [site]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


def older_operator(image: ServerTensorFlow, site: Path) -> list[Path]:
    exits = f"import sys\nsys.exit({OLDER!r} + ' (' + __name__ + ')')\n"
    write(site, {
        "tfdata_operator/__init__.py": '__version__ = "0.0.1"\n',
        "tfdata_operator/server/__init__.py": "",
        "tfdata_operator/server/bootstrap.py": exits,
        "tfdata_operator/server/main.py": exits,
        "tfdata_operator/server/tfserver.py": exits,
        "tfdata_operator/wire/__init__.py": "",
        "tfdata_operator/wire/serverconfig.py": "# older: none of today's settings\nOLDEST_PYTHON = (3, 8)\n",
        "sitecustomize.py": "import tfdata_operator.wire.serverconfig\n",
    })  # fmt: skip
    return [site]


def named_like_ours(image: ServerTensorFlow, site: Path) -> list[Path]:
    # First a namespace package (no __init__.py) holding a server program, then a module: Python
    # imports the module for `tfdata_operator` and keeps searching past the namespace portion.
    write(site / "namespace", {"tfdata_operator/server/bootstrap.py": f"raise SystemExit({OLDER!r})\n"})
    write(site / "module", {"tfdata_operator.py": '"""The team\'s own helpers for its tf.data pipelines."""\n'})
    return [site / "namespace", site / "module"]


IMAGES: dict[str, Callable[[ServerTensorFlow, Path], list[Path]]] = {
    "trainer-package": trainer_package,
    "older-operator": older_operator,
    "named-like-ours": named_like_ours,
}
# What the image's own Python imports as ours: its copy, or it could not tell this test anything.
WHAT_THE_IMAGE_IMPORTS = (
    "import importlib.util, sys\n"
    "import tfdata_operator\n"
    "print(tfdata_operator.__file__ or list(tfdata_operator.__path__))\n"
    "print(importlib.util.find_spec('tfdata_operator.server') is not None if hasattr(tfdata_operator, '__path__') "
    "else 'module')\n"
    "print('tfdata_operator.wire.serverconfig' in sys.modules)\n"
)
IMAGE_HAS = {
    "trainer-package": ("site/tfdata_operator/__init__.py", "False", "False"),
    "older-operator": ("site/tfdata_operator/__init__.py", "True", "True"),
    "named-like-ours": ("site/module/tfdata_operator.py", "module", "False"),
}


@pytest.fixture(params=list(IMAGES))
def image(request: pytest.FixtureRequest, tmp_path: Path, oldest: ServerTensorFlow) -> tuple[str, dict[str, str]]:
    """An image's name and its environment: the stand-in's Python with its packages on PYTHONPATH."""
    name = request.param
    paths = IMAGES[name](oldest, tmp_path / "site")
    env = {"PYTHONPATH": os.pathsep.join(map(str, paths))}
    seen = subprocess.run([str(oldest.python), "-c", WHAT_THE_IMAGE_IMPORTS], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    lines = seen.stdout.split("\n")[:3]
    expected = IMAGE_HAS[name]
    assert seen.returncode == 0 and lines[0].endswith(expected[0]) and lines[1:] == list(expected[1:]), (
        f"the image stand-in does not hold its own copy as this test needs: {seen.stdout!r} {seen.stderr[-2000:]}"
    )
    return name, env


@pytest.fixture
def image_launch(tmp_path_factory: pytest.TempPathFactory, oldest: ServerTensorFlow) -> Iterator[Launch]:
    yield from servers.launcher(tmp_path_factory, oldest)


def test_the_injected_program_serves_on_an_image_with_its_own_tfdata_operator(
    image: tuple[str, dict[str, str]], image_launch: Launch
) -> None:
    name, env = image
    dispatcher_port = free_port()
    dispatcher = image_launch(DispatcherServerConfig(port=dispatcher_port, health_port=free_port()), env=env)
    worker = image_launch(worker_config(dispatcher_port), pod_name=POD_NAME, env=env)
    body = dispatcher.wait_probe("/readyz", 200, contains="1 workers registered")
    assert f"dispatcher serving on port {dispatcher_port}" in body, body
    worker.wait_probe("/readyz", 200)
    for process in (dispatcher, worker):
        info = serverinfo.from_json(process.wait_probe(serverinfo.INFO_PATH, 200))
        assert info.tensorflow_version == "2.16.2", (name, info)
        assert OLDER not in process.log(), process.log()
        assert process.terminate(timeout=30) == 0, process.log()
