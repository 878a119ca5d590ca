"""A trainer reading through a TFDataService with the client helper (tfdata_operator.client).

In a pod that takes the service's published settings (``envFrom: configMapRef: imagenet-client``,
see trainer-job/job.yaml), the address and the processing mode need no flags:

    python trainer.py --service imagenet '/data/train-*.tfrecord'

Elsewhere, give the address and the service's sharding policy:

    ADDRESS=$(kubectl get tfdata imagenet -o jsonpath='{.status.dispatcherAddress}')
    python trainer.py --policy DYNAMIC "$ADDRESS" '/data/train-*.tfrecord'

Trainers started with the same --job-name share one pass over the data, and must build
the same pipeline: a trainer whose pipeline differs is refused with both fingerprints.
"""

import argparse

import tensorflow as tf

from tfdata_operator.client import distribute, iterate


def pipeline(pattern: str) -> tf.data.Dataset:
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=4)
    return dataset.map(lambda record: tf.strings.length(record))  # your parsing and preprocessing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", nargs="?", help="the dispatcher's address; default: the published settings")
    parser.add_argument("pattern", help="the TFRecord files, e.g. '/data/train-*.tfrecord'")
    parser.add_argument("--service", help="the TFDataService whose published settings to use")
    parser.add_argument("--policy", default=None, help="the service's shardingPolicy (with an explicit address)")
    parser.add_argument("--job-name", help="trainers with the same job name share one pass (use a new one per run)")
    args = parser.parse_args()
    policy = args.policy or ("DYNAMIC" if args.address else None)

    dataset = pipeline(args.pattern).apply(
        distribute(args.service, address=args.address, sharding_policy=policy, job_name=args.job_name)
    )
    dataset = dataset.batch(32).prefetch(tf.data.AUTOTUNE)
    meter = iterate(dataset)  # measures data stalls, reports them, names a corrupt file
    records = 0
    for step, batch in enumerate(meter):
        records += int(batch.shape[0])
        if step % 100 == 0:
            print(f"step {step}: batch of {batch.shape[0]}")
    print(
        f"done: {records} records in {meter.total_elements} batches, "
        f"waited for data {meter.stall_fraction:.0%} of the time"
    )


if __name__ == "__main__":
    main()
