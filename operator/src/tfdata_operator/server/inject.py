"""``python3 -m tfdata_operator.server.inject DIR``: the server program, for an image of the user's.

An init container runs it from the operator's image into an emptyDir that the server container
mounts at ``serverconfig.INJECT_MOUNT``. It copies what ``tfdata-server`` needs besides Python and
TensorFlow, which the user's image has: this package's server program (``tfdata_operator``'s
``__init__.py``, ``server/`` and ``wire/``, and the trainer's helper ``client/``) and the
pure-Python packages it imports (click, prometheus_client) under ``DIR/python``, and the program
itself, ``DIR/tfdata-server`` (``launcher_source``). The server runs as another user than this
container, on a read-only root filesystem: every file is readable by anyone, and no bytecode is
copied (none could be written next to the sources either, so Python compiles in memory).
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
# Under DIR: the packages, which the program appends to sys.path.
PYTHON_DIR = "python"
PROGRAM = Path(serverconfig.INJECTED_PROGRAM).name
SKIPPED_DIRS = frozenset({"__pycache__"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")

# The program: kept parseable by old Pythons (no f-strings, no annotations), so one older than
# OLDEST_PYTHON prints what to change instead of a SyntaxError. The image's own packages stay
# first on sys.path; its Python and TensorFlow are checked by ``bootstrap`` before anything else.
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
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), {python_dir!r}))

from tfdata_operator.server import bootstrap

bootstrap.main()
"""


def launcher_source(oldest_python: tuple[int, int] = serverconfig.OLDEST_PYTHON) -> str:
    return LAUNCHER.format(
        module=serverconfig.INJECT_MODULE,
        oldest_python=tuple(oldest_python),
        exit_code=serverconfig.EXIT_UNSUPPORTED_IMAGE,
        python_dir=PYTHON_DIR,
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
