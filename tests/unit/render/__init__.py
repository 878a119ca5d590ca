"""Unit tests of tfdata_operator.render, a file per module."""
