"""The end of a zip's central directory (``webapp.basemodels.zip_end``), read from crafted bytes: the size of the
directory zipfile will read, with a comment, with zip64 records, and refused when cut short or pointing past."""
import io
import struct
import zipfile

import pytest

from webapp.basemodels.zip_end import END_FORMAT, TAIL_BYTES, ZipEnd, zip_end


def packed(*, comment: bytes = b"", members: int = 3) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for number in range(members):
            archive.writestr(f"file-{number}.txt", b"x" * number)
        archive.comment = comment
    return buffer.getvalue()


def central_directory_bytes(data: bytes) -> int:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return sum(46 + len(info.filename) + len(info.extra) + len(info.comment) for info in archive.infolist())


def end_of(data: bytes) -> ZipEnd | None:
    return zip_end(data[-TAIL_BYTES:], file_size=len(data))


def with_zip64_records(data: bytes, *, entries: int, size: int, offset: int) -> bytes:
    """``data`` (a zip without a comment) with its end record replaced by a zip64 record, its locator and an end
    record saying 'see zip64' (0xFFFF, 0xFFFFFFFF), as zip writes one past 65,535 members or 4 GiB."""
    body = data[:-END_FORMAT.size]
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, size, offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(body), 1)
    end = END_FORMAT.pack(b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + record + locator + end


def test_it_reads_the_size_offset_and_entries_of_a_plain_zip():
    data = packed()
    size = central_directory_bytes(data)
    assert end_of(data) == ZipEnd(central_directory_bytes=size, central_directory_offset=len(data) - 22 - size,
                                  entries=3, zip64=False)


@pytest.mark.parametrize("comment", [b"a comment", b"c" * 65_535], ids=["short", "longest"])
def test_it_finds_the_record_before_a_comment(comment):
    data = packed(comment=comment)
    assert end_of(data) == end_of(packed())


def test_a_signature_in_a_comment_less_than_a_record_from_the_end_is_a_record_cut_short():
    """The last signature where zipfile looks is the record, to zipfile too, which refuses the archive."""
    data = packed(comment=b"PK\x05\x06" + b"x" * 16)
    with pytest.raises(ValueError, match=r"^its end of central directory record is cut short \(20 of 22 bytes\)$"):
        end_of(data)
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(io.BytesIO(data))


def test_it_reads_the_zip64_record_before_its_locator():
    data = packed()
    size = central_directory_bytes(data)
    data64 = with_zip64_records(data, entries=3, size=size, offset=len(data) - 22 - size)
    assert end_of(data64) == ZipEnd(central_directory_bytes=size, central_directory_offset=len(data) - 22 - size,
                                    entries=3, zip64=True)
    with zipfile.ZipFile(io.BytesIO(data64)) as archive:  # as zipfile reads it
        assert len(archive.infolist()) == 3


def test_a_self_extracting_stub_before_the_zip_is_allowed_for():
    data = b"#!/bin/sh\nexit 0\n" * 100 + packed()
    assert end_of(data).central_directory_bytes == central_directory_bytes(data)


def test_no_record_is_none_for_zipfile_to_refuse():
    assert end_of(b"not a zip at all" * 10) is None
    assert zip_end(b"", file_size=0) is None


def test_a_record_cut_short_is_refused():
    data = packed()[:-5]
    with pytest.raises(ValueError, match=r"^its end of central directory record is cut short \(17 of 22 bytes\)$"):
        end_of(data)


def test_a_record_whose_directory_is_larger_than_the_bytes_before_it_is_refused():
    data = bytearray(packed())
    struct.pack_into("<L", data, len(data) - 22 + 12, 0xFFFF_FFFE)  # the size: 4 GiB, in a file of a few hundred
    with pytest.raises(ValueError, match=(rf"^its end record declares a central directory of 4,294,967,294 bytes, "
                                          rf"ending at byte {len(data) - 22:,}: more than the archive holds before it")):
        end_of(bytes(data))


def test_a_zip64_record_pointing_past_the_file_is_refused():
    data = packed()
    size = central_directory_bytes(data)
    with pytest.raises(ValueError, match="declares a central directory of 1,099,511,627,776 bytes"):
        end_of(with_zip64_records(data, entries=3, size=1 << 40, offset=0))
    with pytest.raises(ValueError, match=r"places the central directory at byte 1,099,511,627,776, past where"):
        end_of(with_zip64_records(data, entries=3, size=size, offset=1 << 40))


def test_the_tail_may_be_the_whole_file_or_its_end():
    data = b"\0" * (TAIL_BYTES + 1000) + packed(comment=b"c" * 65_535)
    assert zip_end(data, file_size=len(data)) == end_of(data)
