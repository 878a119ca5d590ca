"""Checks TFRecord files without TensorFlow: ``tfdata-operator verify-tfrecords``.

A TFRecord file is a sequence of records, each framed as (TensorFlow's
``core/lib/io/record_writer.cc``)::

    uint64 length (little endian)
    uint32 masked CRC32C of the 8 length bytes
    byte   data[length]
    uint32 masked CRC32C of the data

A masked CRC is ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` modulo 2**32. TensorFlow
reports a bad record as a bare ``DataLossError`` ("corrupted record at 1234") that does
not name the file; this module finds the file, the record and the byte offset.

An empty (zero-length) file is valid: it holds zero records, and TensorFlow reads it
without an error. Since a zero-length shard is usually a writer that died before its first
record, it is reported (``FileReport.empty``) and ``--fail-on-empty`` makes it an error.
Offsets in GZIP files count uncompressed bytes, as TensorFlow's do.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import struct
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import google_crc32c

HEADER_BYTES = 12
FOOTER_BYTES = 4
_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b"\x1f\x8b"
COMPRESSIONS = ("auto", "none", "gzip")


def masked_crc(data: bytes) -> int:
    crc: int = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record as TensorFlow writes it (for tests and tools)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


@dataclass(frozen=True)
class FileReport:
    """The result for one file: ``problem`` is None when every record is intact."""

    path: str
    bytes_read: int
    records: int
    problem: str | None = None
    # The first bad record: its index (0-based) and the byte offset where it starts.
    bad_record: int | None = None
    bad_offset: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def empty(self) -> bool:
        return self.ok and self.bytes_read == 0

    def describe(self) -> str:
        if self.ok:
            return f"{self.path}: ok, {self.records} records" + (" (empty file)" if self.empty else "")
        return f"{self.path}: record {self.bad_record} at byte {self.bad_offset}: {self.problem}"


def _open(path: str, compression: str) -> BinaryIO:
    raw = io.BufferedReader(io.FileIO(path), buffer_size=1 << 20)  # the caller closes it
    if compression == "gzip" or (compression == "auto" and raw.peek(2)[:2] == _GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw  # type: ignore[return-value]


_CHUNK = 4 << 20


def verify_file(path: str, compression: str = "auto") -> FileReport:
    """Reads every record of ``path`` and checks its framing and both CRCs; stops at the first bad one.

    Reads in large chunks and parses the records inside each, so files of small records
    are not dominated by one read call per record.
    """
    offset = records = 0  # of the next record, in the (uncompressed) stream
    buf, pos = b"", 0  # unparsed bytes and where the next record starts in them
    try:
        with _open(path, compression) as f:
            eof = False
            while True:
                if len(buf) - pos < HEADER_BYTES and not eof:
                    buf, pos, eof = _refill(f, buf, pos, HEADER_BYTES)
                if pos == len(buf):
                    return FileReport(path, offset, records)
                if len(buf) - pos < HEADER_BYTES:
                    problem = f"truncated record header: {len(buf) - pos} of {HEADER_BYTES} bytes"
                    return FileReport(path, offset, records, problem, records, offset)
                (length,) = struct.unpack_from("<Q", buf, pos)
                (length_crc,) = struct.unpack_from("<I", buf, pos + 8)
                if masked_crc(buf[pos : pos + 8]) != length_crc:
                    problem = "corrupted length (its CRC does not match)"
                    return FileReport(path, offset, records, problem, records, offset)
                size = HEADER_BYTES + length + FOOTER_BYTES
                if len(buf) - pos < size and not eof:
                    buf, pos, eof = _refill(f, buf, pos, size)
                if len(buf) - pos < size:
                    left = len(buf) - pos - HEADER_BYTES
                    problem = f"truncated record: {length} data bytes and a 4-byte CRC expected, {left} left"
                    return FileReport(path, offset, records, problem, records, offset)
                data_end = pos + HEADER_BYTES + length
                (data_crc,) = struct.unpack_from("<I", buf, data_end)
                if masked_crc(buf[pos + HEADER_BYTES : data_end]) != data_crc:
                    problem = "corrupted data (its CRC does not match)"
                    return FileReport(path, offset, records, problem, records, offset)
                pos += size
                offset += size
                records += 1
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        # A damaged GZIP stream or an unreadable file: the problem is at or after the last good record.
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return FileReport(path, offset, records, f"cannot read: {problem}", records, offset)


def _refill(f: BinaryIO, buf: bytes, pos: int, need: int) -> tuple[bytes, int, bool]:
    """Unparsed bytes plus enough new ones for ``need`` (or all that is left); True once the file ended."""
    parts = [buf[pos:]]
    have = len(parts[0])
    while have < need:
        chunk = f.read(max(_CHUNK, need - have))
        if not chunk:
            return b"".join(parts), 0, True
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts), 0, False


def expand(patterns: Iterable[str]) -> tuple[list[str], list[str]]:
    """The files the patterns match (sorted, each once) and the patterns that match nothing."""
    files: dict[str, None] = {}
    unmatched = []
    for pattern in patterns:
        matched = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matched:
            unmatched.append(pattern)
        files.update(dict.fromkeys(matched))
    return list(files), unmatched


@dataclass(frozen=True)
class Summary:
    reports: list[FileReport]
    seconds: float

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.reports)

    @property
    def bad(self) -> list[FileReport]:
        return [r for r in self.reports if not r.ok]

    @property
    def mb_per_second(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds > 0 else 0.0


def verify_files(paths: Sequence[str], jobs: int | None = None, compression: str = "auto") -> Summary:
    """Checks ``paths`` in ``jobs`` processes (the CRC library holds the GIL, so threads would not help)."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(paths)))
    started = time.monotonic()
    if jobs == 1:
        reports = [verify_file(p, compression) for p in paths]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            reports = list(pool.map(verify_file, paths, [compression] * len(paths)))
    return Summary(reports, time.monotonic() - started)
