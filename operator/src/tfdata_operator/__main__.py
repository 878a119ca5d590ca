"""`python -m tfdata_operator` is `tfdata-operator`."""

from .cli import main

main()
