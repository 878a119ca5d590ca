"""tfdata-client's wheel holds the trainer's modules only: of the top package, just its ``__init__``.

setuptools puts every module of a listed package into the wheel, and the operator's top
package also holds ``cli.py`` and ``__main__.py``, which need the operator's dependencies.
Its metadata is written under ``build/`` here, not beside the operator's sources.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

TOP = "tfdata_operator"


class TrainerModules(build_py):
    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if package != TOP or m[1] == "__init__"]


os.makedirs("build", exist_ok=True)
setup(cmdclass={"build_py": TrainerModules}, options={"egg_info": {"egg_base": "build"}})
