"""The sharding policies, for the spec's parser and the trainers' published settings alike."""

from __future__ import annotations

# What TensorFlow 2.21 accepts, read from its sources and checked against the tensorflow-cpu
# wheel: tf.data.experimental.service.ShardingPolicy's members.
SHARDING_POLICIES = ("OFF", "DYNAMIC", "FILE", "DATA", "FILE_OR_DATA", "HINT")
# These need the dispatcher to know the exact worker list, fixed when it starts.
STATIC_POLICIES = frozenset({"FILE", "DATA", "FILE_OR_DATA", "HINT"})
