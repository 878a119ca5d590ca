"""`python -m devcluster.node`: the node agent's command line (devcluster.node.cli)."""

import sys

from .cli import main

sys.exit(main())
