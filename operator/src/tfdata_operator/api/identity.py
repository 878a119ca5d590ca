"""The API's identity and the keys a person greps for: written here once, read everywhere else.

The group, version, kind and plural of the TFDataService resource, the field manager the
operator writes as, and the label and annotation keys on its children.
"""

from __future__ import annotations

API_GROUP = "tfdata.dev"
VERSION = "v1alpha1"
API_VERSION = f"{API_GROUP}/{VERSION}"
KIND = "TFDataService"
PLURAL = "tfdataservices"
# The field manager of every write, and the managed-by label's value on every child.
MANAGER = "tfdata-operator"

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER}"
CONFIG_HASH_ANNOTATION = f"{API_GROUP}/config-hash"
# Pods with this label, valued with the TFDataService's name, may connect to its servers.
CLIENT_LABEL = f"{API_GROUP}/client"

# The TFDataSnapshot resource: one tf.data distributed snapshot that a service's workers write.
SNAPSHOT_KIND = "TFDataSnapshot"
SNAPSHOT_PLURAL = "tfdatasnapshots"
# On a TFDataSnapshot with deletionPolicy Delete: its files are deleted before the object goes.
SNAPSHOT_FINALIZER = f"{API_GROUP}/snapshot-data"
