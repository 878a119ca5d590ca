"""A trainer for tests/server/test_trainer_client.py: builds a pipeline, reads it through the client helper.

Argument: one JSON object (address, policy, pipeline, job_name, ...). Prints one JSON line:
``{"elements": [...]}`` or ``{"error": "<type>", "message": "..."}``, or ``{"fingerprint": ...}``.
"""

import json
import sys
import time
import warnings

import tensorflow as tf

from tfdata_operator import client

args = json.loads(sys.argv[1])
if args.get("trace_first"):  # other traced functions first: function names then differ from a fresh process
    for i in range(5):
        tf.data.Dataset.range(3).map(lambda x, i=i: x + i).filter(lambda x: x > 0)


def pipeline(kind: str) -> tf.data.Dataset:
    n = args.get("n", 100)
    if kind == "double":
        return tf.data.Dataset.range(n).shuffle(10).map(lambda x: x * 2)
    if kind == "triple":
        return tf.data.Dataset.range(n).shuffle(10).map(lambda x: x * 3)
    if kind == "double-batched":
        return tf.data.Dataset.range(n).shuffle(10).map(lambda x: x * 2).batch(2)
    if kind == "floats":
        return tf.data.Dataset.range(n).shuffle(10).map(lambda x: tf.fill([3], tf.cast(x, tf.float32)))
    if kind == "tftext":  # an op of tensorflow_text's in the map function: TFText>WhitespaceTokenizeWithOffsetsV2
        import tensorflow_text

        tokenizer = tensorflow_text.WhitespaceTokenizer()
        return tf.data.Dataset.from_tensor_slices(["a b", "c d e"]).map(lambda s: tf.size(tokenizer.tokenize(s)))
    if kind == "tfrecords":
        files = tf.data.Dataset.list_files(args["pattern"], shuffle=False)
        return files.interleave(tf.data.TFRecordDataset, cycle_length=2).map(tf.strings.length)
    raise SystemExit(f"unknown pipeline {kind}")


dataset = pipeline(args["pipeline"])
if args.get("fingerprint_only"):
    f = client.dataset_fingerprint(dataset)
    print(json.dumps({"fingerprint": f.digest, "chain": [t.describe() for t in f.transformations]}))
    raise SystemExit(0)
expected = None
if "expect" in args:
    expected = tf.TensorSpec(args["expect"]["shape"], args["expect"]["dtype"])
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = dataset.apply(
            client.distribute(
                address=args["address"],
                sharding_policy=args["policy"],
                processing_mode=args.get("mode"),
                job_name=args.get("job_name"),
                on_mismatch=args.get("on_mismatch", "error"),
                element_spec=expected,
                check_servers=args.get("check_servers", True),
                server_info_url=args.get("server_info_url"),
            )
        )
    elements = []
    for element in client.iterate(dataset, report_url=args.get("report_url")):
        elements.append(element.numpy().tolist())
        time.sleep(args.get("step_seconds", 0))
    result = {
        "elements": elements,
        "warnings": [str(w.message) for w in caught],
        "warning_types": [type(w.message).__name__ for w in caught],
    }
except Exception as exc:
    result = {
        "error": type(exc).__name__,
        "message": str(exc),
        "is_data_loss": isinstance(exc, tf.errors.DataLossError),
    }
print(json.dumps(result), flush=True)
