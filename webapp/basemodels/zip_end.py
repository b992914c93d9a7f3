"""A zip's end-of-central-directory record (and its zip64 locator and record), read from the archive's last bytes.

Design note: ``zipfile`` reads a zip's central directory whole into memory, an object per entry, before its members
can be counted, so an upload's directory is bounded first (``uploads._unpack_zip``) from the size this record
declares. The record is found where ``zipfile`` looks for it, the last signature in the file's last 64 KiB and 22 bytes
(a comment of up to 65,535 bytes may follow it), and a zip64 record is taken, as ``zipfile`` takes it, from just
before its locator: the size judged here is the size ``zipfile`` then reads. Specification: PKWARE's APPNOTE.TXT,
4.3.14 to 4.3.16.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

END_SIGNATURE = b"PK\x05\x06"
ZIP64_LOCATOR_SIGNATURE = b"PK\x06\x07"
ZIP64_END_SIGNATURE = b"PK\x06\x06"
END_FORMAT = struct.Struct("<4s4H2LH")  # signature, disk numbers, entries (this disk, all), size, offset, comment length
ZIP64_LOCATOR_FORMAT = struct.Struct("<4sLQL")  # signature, disk, the zip64 record's offset, disks
ZIP64_END_FORMAT = struct.Struct("<4sQ2H2L4Q")  # signature, record size, versions, disks, entries ×2, size, offset
# Where zipfile looks for the end record: the file's last 64 KiB and 22 bytes (a comment holds up to 65,535 bytes).
SEARCH_BYTES = END_FORMAT.size + (1 << 16)
# The bytes of an archive's end that hold its end record wherever zipfile may find it, with the zip64 records
# before the earliest place it may start.
TAIL_BYTES = ZIP64_END_FORMAT.size + ZIP64_LOCATOR_FORMAT.size + SEARCH_BYTES


@dataclass(frozen=True, kw_only=True)
class ZipEnd:
    """What a zip's end records declare of its central directory: its size, its offset (from the first disk's
    start, as written, which a self-extracting stub before the zip shifts) and its entries."""
    central_directory_bytes: int
    central_directory_offset: int
    entries: int
    zip64: bool


def zip_end(tail: bytes, *, file_size: int) -> ZipEnd | None:
    """The end records in ``tail``, the last ``TAIL_BYTES`` (or all) of an archive of ``file_size`` bytes; None when
    there is no end record where zipfile looks (not a zip: zipfile says so in its words).

    A ``ValueError`` saying what is wrong when the last end record is cut short, or when the size or offset it
    declares puts the central directory outside the bytes before it (an archive cut short, or damaged)."""
    tail_start = file_size - len(tail)  # the file offset of tail[0]
    search_from = max(len(tail) - SEARCH_BYTES, 0)
    at = tail.rfind(END_SIGNATURE, search_from)
    if at < 0:
        return None
    if len(tail) - at < END_FORMAT.size:
        raise ValueError(f"its end of central directory record is cut short ({len(tail) - at} of "
                         f"{END_FORMAT.size} bytes)")
    _signature, _disk, _disk_start, _entries_here, entries, size, offset, _comment = END_FORMAT.unpack_from(tail, at)
    directory_end = tail_start + at  # the central directory lies before the records that follow it
    zip64 = _zip64_end(tail, at - ZIP64_LOCATOR_FORMAT.size)
    if zip64 is not None:
        entries, size, offset = zip64
        directory_end -= ZIP64_LOCATOR_FORMAT.size + ZIP64_END_FORMAT.size
    if size > directory_end:
        raise ValueError(f"its end record declares a central directory of {size:,} bytes, ending at byte "
                         f"{directory_end:,}: more than the archive holds before it (cut short, or damaged)")
    if offset > directory_end - size:
        raise ValueError(f"its end record places the central directory at byte {offset:,}, past where the archive "
                         f"can hold it ({directory_end - size:,}): cut short, or damaged")
    return ZipEnd(central_directory_bytes=size, central_directory_offset=offset, entries=entries,
                  zip64=zip64 is not None)


def _zip64_end(tail: bytes, locator_at: int) -> tuple[int, int, int] | None:
    """The entries, size and offset of the zip64 record before the locator at ``locator_at``; None when there is no
    locator there, or no zip64 record just before it (zipfile then keeps the plain record's values, as here)."""
    record_at = locator_at - ZIP64_END_FORMAT.size
    if record_at < 0 or tail[locator_at:locator_at + 4] != ZIP64_LOCATOR_SIGNATURE:
        return None
    if tail[record_at:record_at + 4] != ZIP64_END_SIGNATURE:
        return None
    fields = ZIP64_END_FORMAT.unpack_from(tail, record_at)
    _signature, _record_size, _made_by, _needed, _disk, _disk_start, _entries_here, entries, size, offset = fields
    return entries, size, offset
