"""The trainer package (operator/client-dist, ``tfdata-client``) alone: the helper and verify-tfrecords, no operator.

A fresh virtual environment (no system site-packages, no TensorFlow) gets the package from the
wheels ``make venv`` keeps (``--no-index``: nothing is downloaded); the helper must import and
``verify-tfrecords`` must check files there without kopf, the Kubernetes client or TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tfdata_operator.wire import tfrecords

ROOT = Path(__file__).resolve().parents[3]
WHEELHOUSE = Path(os.environ.get("TFDATA_CACHE") or Path.home() / ".cache" / "tfdata-operator") / "wheels"
OPERATOR_ONLY = ("kopf", "kubernetes", "prometheus_client", "yaml", "tensorflow")


def site_packages_kb(venv: Path) -> int:
    (site,) = venv.glob("lib/python*/site-packages")
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file()) // 1024


def run(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def test_the_trainer_package_installs_and_works_without_the_operators_dependencies(tmp_path: Path) -> None:
    # A copy of the package's directory next to the sources it builds from, so the build writes nothing in the tree.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "operator" / "client-dist", project / "client-dist", ignore=shutil.ignore_patterns("build"))
    (project / "src").symlink_to(ROOT / "operator" / "src")
    venv = tmp_path / "venv"
    run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv)
    python = venv / "bin" / "python"
    before = site_packages_kb(venv)
    install = run(python, "-m", "pip", "install", "-q", "--no-index", "--find-links", WHEELHOUSE,
                  project / "client-dist", check=False)  # fmt: skip
    assert install.returncode == 0, f"pip install failed (are the wheels in {WHEELHOUSE}? make venv):\n{install.stderr}"
    added_mb = (site_packages_kb(venv) - before) / 1024
    print(f"pip install ./operator/client-dist added {added_mb:.1f} MB to site-packages")

    probe = (
        "import importlib.util, sys, tfdata_operator.client as c\n"
        f"print(sorted(m for m in {OPERATOR_ONLY!r} if importlib.util.find_spec(m)))\n"
        f"print(sorted(m for m in {OPERATOR_ONLY!r} if m in sys.modules))\n"
        "print(importlib.util.find_spec('tfdata_operator.cli') is None, callable(c.distribute))\n"
    )
    installed, imported, helper = run(python, "-c", probe).stdout.splitlines()
    assert installed == "[]", f"installed beside the helper: {installed}"
    assert imported == "[]", f"imported with the helper: {imported}"
    assert helper == "True True", "the helper without the operator's command"
    assert added_mb < 5, f"{added_mb:.1f} MB"

    verify = venv / "bin" / "verify-tfrecords"
    assert run(verify, "--help").stdout.startswith("Usage: verify-tfrecords [OPTIONS] PATTERNS...")
    good, bad = tmp_path / "good.tfrecord", tmp_path / "bad.tfrecord"
    good.write_bytes(b"".join(tfrecords.frame(r) for r in (b"a", b"bc", b"def")))
    bad.write_bytes(good.read_bytes()[:-2])
    checked = run(verify, good, bad, check=False)
    assert checked.returncode == 1, checked
    assert checked.stdout.startswith(f"BAD {bad}: record 2 at byte "), checked.stdout
    assert "checked 2 files, 5 records" in checked.stderr, checked.stderr
