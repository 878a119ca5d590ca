"""A dispatcher and its workers in one process for tests/server/test_trainer_client.py: ``POLICY WORKERS``.

Prints the dispatcher's address once every worker registered, then serves until killed. The
trainers run in other processes, so no worker is local to them, as in a cluster.
"""

import sys
import time

import tensorflow as tf

from tfdata_operator.api.spec import SHARDING_POLICIES
from tfdata_operator.wire.discovery import STATIC_POLICIES

policy, count = sys.argv[1], int(sys.argv[2])
assert policy in SHARDING_POLICIES, policy
ports = [int(p) for p in sys.argv[3 : 3 + count]]
service = tf.data.experimental.service
static = policy in STATIC_POLICIES
dispatcher = service.DispatchServer(
    service.DispatcherConfig(worker_addresses=[f"127.0.0.1:{p}" for p in ports] if static else None)
)
address = dispatcher.target.split("://")[1]
workers = [
    service.WorkerServer(service.WorkerConfig(dispatcher_address=address, worker_address=f"127.0.0.1:{p}", port=p))
    for p in ports
]
while dispatcher._num_workers() < count:
    time.sleep(0.1)
print(dispatcher.target, flush=True)
while True:
    time.sleep(60)
