"""Unit tests of tfdata_operator.client, a file per module."""
