"""Fixtures for end-to-end tests: dispatcher and worker pods that really run `tfdata-server`
with TensorFlow, and real tf.data clients.

By default the session starts its own cluster WITH the dev node (devcluster.node) in
`.local/e2e-cluster-<pid>` and stops it at the end (the state dir, with the components' and
pods' logs, is kept when a test failed). To use an existing cluster instead, name its
kubeconfig, as for tests/integration:

    TFDATA_TEST_KUBECONFIG=.local/kubeconfig pytest tests/e2e

Clients run in a network namespace of the dev node (`nodeagent.client_netns`), which resolves
the cluster's Service and pod names. That works for a cluster started with
`python -m devcluster up --node` (`make dev-cluster`): its state dir is the kubeconfig's
directory. On any other cluster (kind, ...) the pods' network is not reachable from here, and
the tests fail saying so. The shared fixtures (`cluster`, `kubectl`,
`namespace`, `operator`, `node_state_dir`) come from tests/fixtures; the hostile tier
(tests/hostile) uses them on a cluster of the same kind.
"""
