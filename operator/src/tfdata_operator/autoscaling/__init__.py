"""The TFData autoscaler: the decision (``policy``), the readings it keeps (``readings``) and
what it says in the status (``status``)."""
