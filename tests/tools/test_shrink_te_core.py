"""tools/offline_gpu/shrink_te_core.py on a tiny synthetic ELF whose .nv_fatbin holds sm_80, sm_90 and sm_120 cubins.

The real input (TE's 276 MB core wheel) is too big for a test; its byte-identical reproduction is a manual check
described in tools/offline_gpu/README.md.
"""

import random
import shutil
import struct
import subprocess
import zipfile

import pytest

from tools.offline_gpu import shrink_te_core as shrink

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd command-line tool is not installed")

ARCHS = (80, 90, 120)
ZSTD_FLAG_SEEN = 0x8011


def zstd_compress(content: bytes) -> bytes:
    return subprocess.run(["zstd", "-c", "-q", "-3"], input=content, capture_output=True, check=True).stdout


def zstd_decompress(frame: bytes) -> bytes:
    return subprocess.run(["zstd", "-d", "-c", "-q"], input=frame, capture_output=True, check=True).stdout


def fake_cubin(arch: int) -> bytes:
    """An ELF header (as a cubin starts) then incompressible bytes, so the frame has room for a stand-in."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HHI", header, 0x10, 2, 190, 1)  # ET_EXEC, EM_CUDA, version
    struct.pack_into("<QQ", header, 0x20, 64, 1234)  # program / section header tables, to be emptied
    return bytes(header) + random.Random(arch).randbytes(3000 + 100 * (arch % 7))


def fatbin_entry(arch: int) -> bytes:
    content = fake_cubin(arch)
    frame = zstd_compress(content)
    payload = frame + bytes(-len(frame) % 8)  # payloads are padded; the header says how much is the frame
    header = bytearray(64)
    struct.pack_into("<HHIQI", header, 0, shrink.CUBIN_KIND, 0x0101, 64, len(payload), len(frame))
    struct.pack_into("<I", header, 28, arch)
    struct.pack_into("<Q", header, 40, ZSTD_FLAG_SEEN)
    struct.pack_into("<Q", header, 56, len(content))
    return bytes(header) + payload


def synthetic_library() -> bytes:
    """ELF header, .shstrtab, .nv_fatbin (one container of three entries), section header table."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    body = b"".join(fatbin_entry(arch) for arch in ARCHS)
    fatbin = shrink.CONTAINER_HEADER.pack(shrink.CONTAINER_MAGIC, 1, 16, len(body)) + body
    names_offset = 64
    fatbin_offset = names_offset + len(names) + (-len(names) % 8)
    table_offset = fatbin_offset + len(fatbin)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, table_offset)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    sections = bytes(64)
    sections += struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_offset, len(names), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 11, 1, 2, 0, fatbin_offset, len(fatbin), 0, 0, 8, 0)
    return bytes(header) + names.ljust(fatbin_offset - names_offset, b"\0") + fatbin + sections


def entries_of(data: bytes) -> list:
    offset, size = shrink.find_elf_section(data, shrink.FATBIN_SECTION)
    return [e for c in shrink.parse_fatbin(data, offset, size) for e in c.entries]


def payload(data: bytes, entry) -> bytes:
    return data[entry.payload_offset : entry.payload_offset + entry.payload_size]


def test_parser_finds_each_entry_with_its_arch_and_sizes():
    data = synthetic_library()
    entries = entries_of(data)
    assert [e.arch for e in entries] == list(ARCHS)
    for entry in entries:
        assert entry.kind == shrink.CUBIN_KIND and entry.header_size == 64 and entry.flags == ZSTD_FLAG_SEEN
        assert entry.decompressed_size == len(fake_cubin(entry.arch))
        assert payload(data, entry)[:4] == shrink.ZSTD_MAGIC
        assert entry.compressed_size <= entry.payload_size < entry.compressed_size + 8
        assert zstd_decompress(payload(data, entry)[: entry.compressed_size]) == fake_cubin(entry.arch)


def test_shrinking_keeps_arch_90_and_every_header_and_offset():
    data = synthetic_library()
    shrunk, entries = shrink.shrink_library(data, keep_archs={90})
    assert len(shrunk) == len(data)
    assert entries_of(shrunk) == entries  # every container and entry header parses to the same fields
    changed = [i for i in range(len(data)) if data[i] != shrunk[i]]
    payload_bytes = {i for e in entries for i in range(e.payload_offset, e.payload_offset + e.payload_size)}
    assert set(changed) <= payload_bytes  # ELF header, section table, fatbin headers untouched
    for entry in entries:
        if entry.arch == 90:
            assert payload(shrunk, entry) == payload(data, entry)
            continue
        assert payload(shrunk, entry) != payload(data, entry)
        content = zstd_decompress(payload(shrunk, entry)[: entry.compressed_size])
        assert len(content) == entry.decompressed_size
        assert content[:16] == fake_cubin(entry.arch)[:16]  # the cubin's identity (class, machine) is kept
        assert struct.unpack_from("<QQ", content, 0x20) == (0, 80)  # no program headers; section table follows
        assert content[208:] == bytes(len(content) - 208)


def test_wheel_gets_new_library_and_matching_record(tmp_path):
    source, destination = tmp_path / "in.whl", tmp_path / "out.whl"
    record = "pkg-1.dist-info/RECORD"
    with zipfile.ZipFile(source, "w") as wheel:
        wheel.writestr(shrink.SO_MEMBER, synthetic_library())
        wheel.writestr(record, f"{shrink.SO_MEMBER},sha256=old,1\n{record},,\n")
    table = shrink.shrink_wheel(str(source), str(destination), keep_archs={90})
    assert "sm_90 " in table and "kept" in table and "stubbed" in table
    with zipfile.ZipFile(destination) as wheel:
        library = wheel.read(shrink.SO_MEMBER)
        lines = wheel.read(record).decode().split("\n")
    assert library == shrink.shrink_library(synthetic_library(), {90})[0]
    assert lines[0] == f"{shrink.SO_MEMBER},{shrink.record_hash(library)},{len(library)}"
    assert lines[1:] == [f"{record},,", ""]


def test_uncompressed_dropped_entry_is_refused_and_nothing_written(tmp_path):
    data = bytearray(synthetic_library())
    first = entries_of(bytes(data))[0]
    data[first.payload_offset : first.payload_offset + 4] = b"\0\0\0\0"  # no longer a zstd frame
    source, destination = tmp_path / "in.whl", tmp_path / "out.whl"
    with zipfile.ZipFile(source, "w") as wheel:
        wheel.writestr(shrink.SO_MEMBER, bytes(data))
    assert shrink.main([str(source), str(destination)]) == 1
    assert not destination.exists() and list(tmp_path.iterdir()) == [source]
