"""Unit tests of tfdata_operator.api, a file per module."""
