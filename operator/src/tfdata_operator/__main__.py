"""`python -m tfdata_operator` is `tfdata-operator`."""

from tfdata_operator.cli import main

main()
