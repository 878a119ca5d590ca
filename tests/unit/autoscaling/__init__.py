"""Unit tests of tfdata_operator.autoscaling, a file per module."""
