"""A job claimed for one pipeline on the dispatcher itself (the package docstring says how): the
claim a trainer registers, and the one that holds. TensorFlow is imported only when called."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from tfdata_operator.client import fingerprint as fp

CLAIM_PREFIX = "tfdata-operator.job."


@dataclass(frozen=True)
class Claim:
    """What the first trainer on a job registered: its pipeline's identity."""

    fingerprint: str
    element_spec: str
    transformations: tuple[fp.Transformation, ...]

    def marker_keys(self) -> list[str]:
        chain = json.dumps([[t.op, list(t.functions), t.digest[:16]] for t in self.transformations])
        return [f"fingerprint={self.fingerprint}", f"element_spec={self.element_spec}", f"transformations={chain}"]

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> Claim:
        fields = dict(k.split("=", 1) for k in keys if "=" in k)
        return cls(
            fields.get("fingerprint", "?"),
            fields.get("element_spec", "?"),
            fp.Fingerprint.chain_from_json(fields.get("transformations", "[]")),
        )


def _parse_service(address: str) -> tuple[str, str]:
    protocol, sep, rest = address.partition("://")
    return (protocol, rest) if sep else ("grpc", address)


def claim_job(address: str, job_name: str, claim: Claim) -> Claim:
    """Claims ``job_name`` for a pipeline on the dispatcher; returns the claim that holds (maybe another's)."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops.data_service_ops import nested_structure_coder
    from tensorflow.python.data.experimental.service import _pywrap_server_lib

    claim_id = CLAIM_PREFIX + job_name
    marker = tf.data.Dataset.from_tensors({key: tf.constant(0, tf.int8) for key in claim.marker_keys()})
    try:
        tf.data.experimental.service.register_dataset(address, marker, compression=None, dataset_id=claim_id)
        return claim
    except tf.errors.InvalidArgumentError as exc:
        if "same structure" not in str(exc):
            raise
    protocol, host = _parse_service(address)
    metadata = _pywrap_server_lib.TF_DATA_GetDataServiceMetadataByID(claim_id, host, protocol)
    struct_pb = nested_structure_coder.struct_pb2.StructuredValue()
    struct_pb.ParseFromString(metadata.element_spec)
    return Claim.from_keys(nested_structure_coder.decode_proto(struct_pb))
