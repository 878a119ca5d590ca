"""What a trainer's pipeline is, read from its dataset graph: its fingerprint (``fingerprint``), its
element spec as stable text, and the files its string constants name (for naming a corrupt one).
TensorFlow is imported only when these functions are called."""

from __future__ import annotations

import glob
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tfdata_operator.client import fingerprint as fp

if TYPE_CHECKING:
    import tensorflow as tf


_DT_STRING = 7


# Files the distributed pipelines of this process read, for naming a corrupt one.
input_files: dict[str, None] = {}


def describe_spec(spec: Any) -> str:
    """Dtypes and shapes of an element spec as stable text (names are left out)."""
    import tensorflow as tf

    if isinstance(spec, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe_spec(spec[k])}" for k in sorted(spec)) + "}"
    if isinstance(spec, (tuple, list)):
        items = spec._asdict().items() if hasattr(spec, "_asdict") else None
        if items is not None:
            return type(spec).__name__ + "(" + ", ".join(f"{k}={describe_spec(v)}" for k, v in items) + ")"
        return "(" + ", ".join(describe_spec(s) for s in spec) + ")"
    if isinstance(spec, tf.TensorSpec):
        shape = spec.shape.as_list() if spec.shape.rank is not None else "<unknown rank>"
        return f"{spec.dtype.name}{shape}"
    return repr(spec)


def dataset_fingerprint(dataset: tf.data.Dataset) -> fp.Fingerprint:
    """The stable fingerprint of a dataset's definition (see ``fingerprint``)."""
    graph = graph_def(dataset)
    return fp.fingerprint(graph)


def graph_def(dataset: tf.data.Dataset) -> Any:
    import tensorflow as tf
    from tensorflow.python.data.ops import options

    serialized = dataset._as_serialized_graph(  # the graph tf.data service ships to its workers
        external_state_policy=options.ExternalStatePolicy.IGNORE, strip_device_assignment=True
    )
    return tf.compat.v1.GraphDef.FromString(serialized.numpy())


def _string_constants(graph: Any) -> Iterable[str]:
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    for node in nodes:
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is None or tensor.dtype != _DT_STRING:
            continue
        values = list(tensor.string_val)
        if tensor.tensor_content:
            count = 1
            for dim in tensor.tensor_shape.dim:
                count *= dim.size
            values += _decode_string_list(tensor.tensor_content, count)
        for value in values:
            yield value.decode("utf-8", "replace")


def _decode_string_list(content: bytes, count: int) -> list[bytes]:
    """TensorFlow's packed string tensor (``port::EncodeStringList``): ``count`` varint lengths, then the bytes."""
    lengths, pos = [], 0
    for _ in range(count):
        length = shift = 0
        while pos < len(content):
            byte = content[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        lengths.append(length)
    out = []
    for length in lengths:
        out.append(content[pos : pos + length])
        pos += length
    return out


def remember_input_files(graph: Any) -> None:
    """The files the pipeline's string constants name (paths or patterns), for naming a corrupt one."""
    for text in _string_constants(graph):
        if "/" in text or "." in text:
            for path in glob.glob(text):
                input_files[path] = None
