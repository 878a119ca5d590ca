"""Unit tests of tfdata_operator.wire, a file per module."""
