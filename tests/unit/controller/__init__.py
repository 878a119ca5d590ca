"""Unit tests of tfdata_operator.controller, a file per module."""
