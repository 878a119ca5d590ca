"""Unit tests of tfdata_operator.plan, a file per module."""
