"""The ``verify-tfrecords`` command: ``tfdata-operator verify-tfrecords``, and ``verify-tfrecords`` of either package.

One command for the operator's package and the trainer's (``tfdata-client``, which has
neither the operator nor its dependencies), so both check files the same way. The checks
themselves are ``tfrecords``; no TensorFlow needed.
"""

from __future__ import annotations

import sys

import click

from tfdata_operator.wire import tfrecords


@click.command("verify-tfrecords")
@click.argument("patterns", nargs=-1, required=True)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Files checked in parallel.  [default: the number of CPUs]")  # fmt: skip
@click.option("--compression", type=click.Choice(tfrecords.COMPRESSIONS), default="auto", show_default=True,
              help="auto: GZIP when a file starts with the GZIP magic bytes, else uncompressed.")  # fmt: skip
@click.option("--fail-on-empty", is_flag=True,
              help="Count zero-length files as bad (TensorFlow reads them as zero records).")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="Print every file, not only the bad ones.")
def verify_tfrecords(patterns: tuple[str, ...], jobs: int | None, compression: str, fail_on_empty: bool,
                     verbose: bool) -> None:  # fmt: skip
    """Checks the record framing and CRCs of TFRecord files matching PATTERNS (globs, ** allowed).

    Prints each bad file with the index and byte offset of its first bad record, then the
    throughput; exits 1 if any file is bad, 2 if a pattern matches no file. No TensorFlow needed.
    """
    files, unmatched = tfrecords.expand(patterns)
    if unmatched:
        raise click.UsageError(f"no file matches {', '.join(map(repr, unmatched))}")
    summary = tfrecords.verify_files(files, jobs, compression)
    bad = summary.bad + ([r for r in summary.reports if r.empty] if fail_on_empty else [])
    for report in summary.reports:
        if report in bad:
            click.echo(f"BAD {report.describe()}" + (" (--fail-on-empty)" if report.empty else ""))
        elif verbose or report.empty:
            click.echo(f"ok  {report.describe()}")
    records = sum(r.records for r in summary.reports)
    click.echo(
        f"checked {len(files)} files, {records} records, {summary.bytes_read / 1e6:.1f} MB in "
        f"{summary.seconds:.2f}s ({summary.mb_per_second:.1f} MB/s): {len(bad)} bad",
        err=True,
    )
    if bad:
        sys.exit(1)
