#!/usr/bin/env python3
"""Writes examples/multi-worker/scripts.yaml, the ConfigMap that carries the example's entry.py and
train.py into its trainer pods, from those two files (they stay plain Python: linted and run by the
tests; tests/unit/project/test_multi_worker_example.py fails when the ConfigMap differs).

    hack/multi-worker-scripts.py            # rewrite scripts.yaml
    hack/multi-worker-scripts.py --check    # exit 1 if it differs from what would be written
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi-worker"
SCRIPTS = ("entry.py", "train.py")
HEADER = """\
# The trainer's scripts, mounted at /scripts by trainers.yaml: entry.py and train.py of this folder,
# as they are (written by `make multi-worker-scripts`; edit the .py files, not this).
"""


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, text: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")


def render() -> str:
    dumper = type("Dumper", (yaml.SafeDumper,), {})
    dumper.add_representer(_Literal, _literal)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "multi-worker-trainer"},
        "data": {name: _Literal((EXAMPLE / name).read_text()) for name in SCRIPTS},
    }
    return HEADER + yaml.dump(config_map, Dumper=dumper, sort_keys=False, width=1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that scripts.yaml is up to date")
    target = EXAMPLE / "scripts.yaml"
    written = render()
    if parser.parse_args().check:
        if target.read_text() != written:
            sys.exit(f"{target} differs from {', '.join(SCRIPTS)}: run make multi-worker-scripts")
        return
    target.write_text(written)


if __name__ == "__main__":
    main()
