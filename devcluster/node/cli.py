"""`python -m devcluster.node run|client|cleanup` (see the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .agent import NODE_NAME, Agent
from .clients import client_env, client_netns
from .containers import REPO, default_venv_bin
from .network import cleanup


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.node", description=(PACKAGE_DOC or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="be the node (devcluster's NODE_AGENT component runs this)")
    client = sub.add_parser("client", help="run a command in a client network namespace of the cluster")
    clean = sub.add_parser("cleanup", help="remove a cluster's namespaces, links and processes")
    for p in (run, client, clean):
        p.add_argument("--state-dir", type=Path, default=REPO / ".local")
    run.add_argument(
        "--kubeconfig", type=Path, help="default: STATE_DIR/kubeconfig (admin: it creates PVs and a StorageClass)"
    )
    run.add_argument("--node-name", default=NODE_NAME)
    run.add_argument("--venv-bin", type=Path, default=default_venv_bin(), help="first on the containers' PATH")
    client.add_argument("--namespace", default="default", help="where short Service names resolve")
    client.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.command == "run":
        Agent(args.state_dir, args.kubeconfig or args.state_dir / "kubeconfig", args.node_name, args.venv_bin).run()
    elif args.command == "cleanup":
        cleanup(args.state_dir)
    else:
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("client: no command given (client --state-dir DIR -- COMMAND ...)")
        with client_netns(args.state_dir, args.namespace) as prefix:
            return subprocess.run([*prefix, *command], env=client_env(), check=False).returncode
    return 0
