"""Unit tests of tfdata_operator.api.spec, a file per module (the whole spec's parse and its golden
refusals: ../test_spec.py)."""
