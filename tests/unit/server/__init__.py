"""Unit tests of tfdata_operator.server, a file per module."""
