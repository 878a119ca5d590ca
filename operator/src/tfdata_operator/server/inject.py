"""``python3 -m tfdata_operator.server.inject DIR``: the server program, for an image of the user's.

An init container runs it from the operator's image into an emptyDir that the server container
mounts at ``serverconfig.INJECT_MOUNT``. It copies what ``tfdata-server`` needs besides Python and
TensorFlow, which the user's image has: this package's server program (``tfdata_operator``'s
``__init__.py``, ``server/`` and ``wire/``, and the trainer's helper ``client/``) and the
pure-Python packages it imports (click, prometheus_client) under ``DIR/python``, and the program
itself, ``DIR/tfdata-server`` (``launcher_source``). The server runs as another user than this
container, on a read-only root filesystem: every file is readable by anyone, and no bytecode is
copied (none could be written next to the sources either, so Python compiles in memory).

Which copy of what loads, whatever the image holds: ``tfdata_operator`` is always this copy, and
everything else the image's own. An image may have a ``tfdata_operator`` of its own: the trainer
package (``tfdata-client``: ``client`` and ``wire`` only, so no server), an older full operator
(an older server program, against today's configuration), or a module that only has the name. So
the program loads the package from its own directory by path (``OWN_PACKAGE``), before the
import system could find the image's copy, and drops any of the image's ``tfdata_operator``
modules already imported at startup (by a ``.pth`` file or ``sitecustomize``). Then it *appends*
``DIR/python`` to ``sys.path``: the dependencies copied there (click, prometheus_client) load only
when the image has none, after its site-packages and its PYTHONPATH, as do TensorFlow and the
rest. The TensorFlow process the server starts (``main.Supervisor.child_command``) does the same.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tfdata_operator
from tfdata_operator.wire import serverconfig

# What of this package the server program is, plus the trainer's helper (``client``), so a trainer
# pod on the same image can take it from the same copy (``sys.path.append(DIR + "/python")``):
# everything else is the operator's.
PACKAGE_PARTS = ("__init__.py", "server", "wire", "client")
# The pure-Python packages the server program imports that an image with TensorFlow may lack
# (TensorFlow brings grpc and protobuf, which the dispatcher's aggregation uses).
DEPENDENCIES = ("click", "prometheus_client")
# Under DIR: the packages. The program loads this package from there by path, and appends the
# directory to sys.path for the dependencies.
PYTHON_DIR = "python"
PROGRAM = Path(serverconfig.INJECTED_PROGRAM).name
SKIPPED_DIRS = frozenset({"__pycache__"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")

# Defines ``load_own_package(directory)``: ``tfdata_operator`` becomes the package in ``directory``
# (the module docstring says why), and its submodules load from there alone (its ``__path__``),
# whatever the image's sys.path, PYTHONPATH or startup imports hold. Source for the program and
# the TensorFlow process's ``-c``, in syntax any Python 3 parses.
OWN_PACKAGE = """\
import importlib.util
import os
import sys


def load_own_package(directory):
    for name in [n for n in sys.modules if n == "tfdata_operator" or n.startswith("tfdata_operator.")]:
        del sys.modules[name]  # the image's, imported at startup
    spec = importlib.util.spec_from_file_location(
        "tfdata_operator", os.path.join(directory, "__init__.py"), submodule_search_locations=[directory]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["tfdata_operator"] = module
    spec.loader.exec_module(module)
"""

# The program: kept parseable by old Pythons (no f-strings, no annotations), so one older than
# OLDEST_PYTHON prints what to change instead of a SyntaxError. Then this package from DIR/python,
# the image's own packages first for everything else (the module docstring); its Python and
# TensorFlow are checked by ``bootstrap`` before anything else.
LAUNCHER = """\
#!/usr/bin/env python3
# tfdata-server for an image of the user's, written by {module}.
import os
import platform
import sys

OLDEST_PYTHON = {oldest_python!r}
if tuple(sys.version_info[:2]) < OLDEST_PYTHON:
    sys.stderr.write(
        "tfdata-server: this image has Python %s; the server program needs Python %d.%d or newer: "
        "use an image with a newer Python as spec.image\\n" % ((platform.python_version(),) + OLDEST_PYTHON)
    )
    sys.exit({exit_code!r})

{own_package}

# Ours from PYTHON whatever the image holds; the image's packages first for everything else.
PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), {python_dir!r})
load_own_package(os.path.join(PYTHON, "tfdata_operator"))
sys.path.append(PYTHON)

from tfdata_operator.server import bootstrap

bootstrap.main()
"""


def launcher_source(oldest_python: tuple[int, int] = serverconfig.OLDEST_PYTHON) -> str:
    return LAUNCHER.format(
        module=serverconfig.INJECT_MODULE,
        oldest_python=tuple(oldest_python),
        exit_code=serverconfig.EXIT_UNSUPPORTED_IMAGE,
        python_dir=PYTHON_DIR,
        own_package=OWN_PACKAGE,
    )


@dataclass(frozen=True)
class Source:
    """One package (or single module) to copy: where it is, and its name under DIR/python."""

    name: str
    root: Path  # the package's directory, or the module's file
    parts: tuple[str, ...] | None = None  # only these entries of the directory; None: all


def sources() -> list[Source]:
    """This package's server program, then its dependencies, found where this Python imports them."""
    found = [Source("tfdata_operator", Path(tfdata_operator.__file__).parent, PACKAGE_PARTS)]
    for name in DEPENDENCIES:
        module_file = Path(str(importlib.import_module(name).__file__))
        root = module_file.parent if module_file.name == "__init__.py" else module_file
        found.append(Source(name, root))
    return found


def files(source: Source) -> Iterator[tuple[Path, Path]]:
    """(file to copy, its path under DIR/python), sorted, without bytecode."""
    if source.root.is_file():
        yield source.root, Path(source.root.name)
        return
    entries = [source.root / part for part in source.parts] if source.parts else [source.root]
    for entry in entries:
        if entry.is_file():
            yield entry, Path(source.name) / entry.relative_to(source.root)
            continue
        for directory, subdirs, names in os.walk(entry):
            subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
            for name in sorted(names):
                if not name.endswith(SKIPPED_SUFFIXES):
                    path = Path(directory) / name
                    yield path, Path(source.name) / path.relative_to(source.root)


def inject(target: Path) -> list[tuple[str, int, int]]:
    """Copies the server program into ``target``; returns (what, files, bytes) per source."""
    python = target / PYTHON_DIR
    copied = []
    for source in sources():
        count = size = 0
        for path, relative in files(source):
            destination = python / relative
            _mkdirs(destination.parent, target)
            shutil.copyfile(path, destination)
            destination.chmod(0o644)
            count, size = count + 1, size + destination.stat().st_size
        copied.append((source.name, count, size))
    program = target / PROGRAM
    program.write_text(launcher_source())
    program.chmod(0o755)
    copied.append((PROGRAM, 1, program.stat().st_size))
    return copied


def _mkdirs(directory: Path, top: Path) -> None:
    """Creates ``directory`` and its parents below ``top``, each searchable by anyone."""
    missing = []
    while directory != top and not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir()
        path.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python3 -m {serverconfig.INJECT_MODULE} DIR", file=sys.stderr)
        return 2
    target = Path(args[0])
    if not target.is_dir():
        print(f"{serverconfig.INJECT_MODULE}: {target} is not a directory (mount an emptyDir there)", file=sys.stderr)
        return 2
    copied = inject(target)
    for name, count, size in copied:
        print(f"copied {name}: {count} file{'' if count == 1 else 's'}, {size / 1024:.0f} KiB")
    total_files, total = sum(c for _, c, _ in copied), sum(s for _, _, s in copied)
    print(f"injected the server program into {target}: {total_files} files, {total / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
