"""verify-tfrecords on hand-corrupted files: framing, both CRCs, every bad file named with its first bad record."""

from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import google_crc32c
from click.testing import CliRunner

from tfdata_operator import cli
from tfdata_operator.wire import tfrecords

RECORDS = [b"first record", b"", b"x" * 1000, b"last"]


def offsets(records: list[bytes]) -> list[int]:
    """Where each record starts."""
    out, at = [], 0
    for r in records:
        out.append(at)
        at += tfrecords.HEADER_BYTES + len(r) + tfrecords.FOOTER_BYTES
    return out


def write(path: Path, records: list[bytes] = RECORDS) -> bytes:
    data = b"".join(tfrecords.frame(r) for r in records)
    path.write_bytes(data)
    return data


def corrupt(path: Path, at: int, flip: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= flip
    path.write_bytes(bytes(data))


def test_crc_is_crc32c_masked_as_tensorflow_does() -> None:
    assert google_crc32c.value(b"123456789") == 0xE3069283  # the CRC-32C check value
    crc = 0xE3069283
    assert tfrecords.masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert struct.unpack("<Q", tfrecords.frame(b"abc")[:8]) == (3,)


def test_a_good_file_is_ok(tmp_path: Path) -> None:
    data = write(tmp_path / "good.tfrecord")
    report = tfrecords.verify_file(str(tmp_path / "good.tfrecord"))
    assert report.ok and not report.empty
    assert (report.records, report.bytes_read) == (len(RECORDS), len(data))


def test_truncated_record(tmp_path: Path) -> None:
    path = tmp_path / "cut.tfrecord"
    data = write(path)
    path.write_bytes(data[:-3])  # a writer that died inside the last record's CRC
    report = tfrecords.verify_file(str(path))
    assert (report.bad_record, report.bad_offset) == (3, offsets(RECORDS)[3])
    assert report.problem is not None and report.problem.startswith("truncated record:")
    assert report.records == 3


def test_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "cut.tfrecord"
    data = write(path)
    path.write_bytes(data[: offsets(RECORDS)[2] + 5])
    report = tfrecords.verify_file(str(path))
    assert (report.bad_record, report.bad_offset) == (2, offsets(RECORDS)[2])
    assert report.problem == "truncated record header: 5 of 12 bytes"


def test_flipped_data_byte(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecord"
    write(path)
    corrupt(path, offsets(RECORDS)[2] + tfrecords.HEADER_BYTES + 500)
    report = tfrecords.verify_file(str(path))
    assert (report.bad_record, report.bad_offset) == (2, offsets(RECORDS)[2])
    assert report.problem == "corrupted data (its CRC does not match)"


def test_flipped_length_byte(tmp_path: Path) -> None:
    path = tmp_path / "length.tfrecord"
    write(path)
    corrupt(path, offsets(RECORDS)[1], flip=0x40)  # record 1 would claim 64 bytes
    report = tfrecords.verify_file(str(path))
    assert (report.bad_record, report.bad_offset) == (1, offsets(RECORDS)[1])
    assert report.problem == "corrupted length (its CRC does not match)"


def test_zero_length_file_is_valid_but_reported(tmp_path: Path) -> None:
    """TensorFlow reads an empty file as zero records; usually a writer died before its first one."""
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    report = tfrecords.verify_file(str(path))
    assert report.ok and report.empty and report.records == 0
    runner = CliRunner()
    result = runner.invoke(cli.main, ["verify-tfrecords", str(path)])
    assert result.exit_code == 0, result.output
    assert "(empty file)" in result.output
    result = runner.invoke(cli.main, ["verify-tfrecords", "--fail-on-empty", str(path)])
    assert result.exit_code == 1
    assert f"BAD {path}" in result.output


def test_gzip_files_are_read_by_their_magic(tmp_path: Path) -> None:
    raw = b"".join(tfrecords.frame(r) for r in RECORDS)
    good, bad = tmp_path / "good.tfrecord.gz", tmp_path / "bad.tfrecord.gz"
    good.write_bytes(gzip.compress(raw))
    damaged = bytearray(raw)
    damaged[offsets(RECORDS)[3] + tfrecords.HEADER_BYTES] ^= 1
    bad.write_bytes(gzip.compress(bytes(damaged)))
    assert tfrecords.verify_file(str(good)).records == len(RECORDS)
    report = tfrecords.verify_file(str(bad))
    assert (report.bad_record, report.bad_offset) == (3, offsets(RECORDS)[3])
    # Read as uncompressed, the GZIP stream is not TFRecord framing.
    assert not tfrecords.verify_file(str(good), compression="none").ok


def test_cli_reports_every_bad_file_in_parallel_and_its_throughput(tmp_path: Path) -> None:
    for i in range(6):
        write(tmp_path / f"shard-{i}.tfrecord")
    corrupt(tmp_path / "shard-1.tfrecord", offsets(RECORDS)[0] + tfrecords.HEADER_BYTES + 2)
    data = (tmp_path / "shard-4.tfrecord").read_bytes()
    (tmp_path / "shard-4.tfrecord").write_bytes(data[:-1])
    result = CliRunner().invoke(cli.main, ["verify-tfrecords", "-j", "2", str(tmp_path / "shard-*.tfrecord")])
    assert result.exit_code == 1, result.output
    bad = [line for line in result.output.splitlines() if line.startswith("BAD ")]
    assert bad == [
        f"BAD {tmp_path}/shard-1.tfrecord: record 0 at byte 0: corrupted data (its CRC does not match)",
        f"BAD {tmp_path}/shard-4.tfrecord: record 3 at byte {offsets(RECORDS)[3]}: truncated record: "
        "4 data bytes and a 4-byte CRC expected, 7 left",
    ]
    assert re.search(r"checked 6 files, 19 records, [0-9.]+ MB in [0-9.]+s \([0-9.]+ MB/s\): 2 bad", result.output)


def test_cli_refuses_patterns_that_match_nothing(tmp_path: Path) -> None:
    write(tmp_path / "a.tfrecord")
    missing = str(tmp_path / "nothing-*.tfrecord")
    result = CliRunner().invoke(cli.main, ["verify-tfrecords", str(tmp_path / "a.tfrecord"), missing])
    assert result.exit_code == 2
    assert f"no file matches '{missing}'" in result.output
