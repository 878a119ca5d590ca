"""A trainer reading through a TFDataService.

Get the address the operator published and pass it to distribute():

    ADDRESS=$(kubectl get tfdata imagenet -o jsonpath='{.status.dispatcherAddress}')
    python trainer.py "$ADDRESS" /data/train-*.tfrecord

The processing mode must match the service's spec.shardingPolicy: a DYNAMIC service
has no worker list, so a FILE client against it fails with a clear error.
"""

import sys

import tensorflow as tf


def main(address: str, pattern: str) -> None:
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=4)
    dataset = dataset.map(lambda record: tf.strings.length(record))  # your parsing and preprocessing
    dataset = dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=address,  # e.g. grpc://imagenet-dispatcher.default.svc.cluster.local:5050
            job_name="train",  # clients sharing a job name share one pass over the data
        )
    )
    dataset = dataset.batch(32).prefetch(tf.data.AUTOTUNE)
    for step, batch in enumerate(dataset):
        if step % 100 == 0:
            print(f"step {step}: batch of {batch.shape[0]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
