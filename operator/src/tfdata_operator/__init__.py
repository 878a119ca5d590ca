"""tfdata-operator: runs TensorFlow's tf.data service on Kubernetes from a TFDataService resource."""

__version__ = "0.1.0"
