"""Writes a TFRecord dataset of several files whose records name themselves ("f<file>-r<record>")."""

from __future__ import annotations

import argparse
from pathlib import Path


def write(directory: Path, files: int, records: int) -> list[str]:
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    expected = []
    for f in range(files):
        with tf.io.TFRecordWriter(str(directory / f"part-{f:03d}.tfrecord")) as writer:
            for r in range(records):
                value = f"f{f}-r{r}"
                writer.write(value.encode())
                expected.append(value)
    return expected


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--records", type=int, default=100)
    args = parser.parse_args()
    print(len(write(args.directory, args.files, args.records)))
