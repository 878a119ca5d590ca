"""The bottom layer: what crosses a process boundary, one typed model for both sides.

The server program's configuration (``serverconfig``), the trainers' and servers' signal
reports (``signals``), the settings published for trainers (``discovery``), what the servers can
run (``serverinfo``), and the TFRecord framing (``tfrecords``) with its command (``verify``). The
operator, the server program in the pods (``server/``) and the trainer's helper (``client/``) all
import these modules, so they import nothing else of this package, nor TensorFlow, nor the
Kubernetes client.
"""
