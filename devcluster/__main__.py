"""`python -m devcluster up|down|env`: the dev cluster's command line (devcluster.controlplane)."""

import sys

from .controlplane import main

sys.exit(main())
