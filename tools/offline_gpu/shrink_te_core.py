"""Shrink Transformer Engine's core wheel to the GPU architectures one machine needs.

Why: the GPU machine we borrow has no network and takes at most 64 MiB per transfer. TE's core wheel
(transformer_engine_cu13-2.20.2, 276 MB) is almost entirely GPU code for ten architectures, stored as
zstd-compressed cubins in the `.nv_fatbin` section of libtransformer_engine.so. An H100/H200 runs only the
sm_90 / sm_90a cubins, so every other cubin is replaced by a tiny stand-in and the wheel deflates to 32 MB.

How, without moving anything: every ELF header, section offset, fatbin container header and fatbin entry
header keeps its bytes, and the .so keeps its size. Only the payload of each dropped entry changes: it becomes
a valid zstd stream that decompresses to exactly the size the entry header declares. Its content is the
original cubin's 64-byte ELF header (with its section and program header tables emptied) followed by zeros,
so a tool that decompresses and inspects every entry still sees a well-formed, empty cubin of the right
architecture. The compressed size the header declares is filled with a zstd skippable frame.

Layouts (little endian) as found in TE 2.20.2's library; the fatbin format is not documented by NVIDIA:
  container header (16 B): magic u32 = 0xBA55ED50, version u16, header size u16, body size u64
  entry header (64, 112 or 120 B): kind u16 (2 = cubin), version u16, header size u32, payload size u64
      (padded), compressed size u32 @16, arch u32 @28 (90 for sm_90 and sm_90a), flags u64 @40,
      decompressed size u64 @56. Flag 0x8000 is set on every zstd-compressed entry seen; 0x100000 on the
      arch-specific ("a") cubins, matching the names cuobjdump lists.

Decompressing a cubin's first bytes needs the `zstd` command-line tool (the `zstandard` module is not in our
venv). `python tools/offline_gpu/shrink_te_core.py IN.whl OUT.whl [--keep-arch 90]` reproduces the wheel the
H200 session used byte for byte (see README.md next to this file).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import threading
import zipfile
from collections import defaultdict
from dataclasses import dataclass

FATBIN_SECTION = ".nv_fatbin"
CONTAINER_MAGIC = 0xBA55ED50
CONTAINER_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, body size
ENTRY_PREFIX = struct.Struct("<HHIQ")  # kind, version, header size, payload size
CUBIN_KIND = 2
ARCH_SPECIFIC_FLAG = 0x100000  # the "a" in sm_90a
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SKIPPABLE_MAGIC = 0x184D2A50
ZSTD_MAX_BLOCK = 128 * 1024
ELF_MAGIC = b"\x7fELF"
ELF_HEADER_SIZE = 64
SO_MEMBER = "transformer_engine/wheel_lib/libtransformer_engine.so"


class ShrinkError(Exception):
    """The input is not what this tool understands; nothing was written."""


@dataclass(frozen=True)
class FatbinEntry:
    offset: int  # file offset of the entry header
    kind: int
    header_size: int
    payload_size: int  # bytes after the header, padding included
    compressed_size: int  # bytes of the payload that hold the zstd frame (0: stored uncompressed)
    arch: int
    flags: int
    decompressed_size: int

    @property
    def payload_offset(self) -> int:
        return self.offset + self.header_size

    @property
    def arch_name(self) -> str:
        return f"sm_{self.arch}" + ("a" if self.flags & ARCH_SPECIFIC_FLAG else "")


@dataclass(frozen=True)
class FatbinContainer:
    offset: int
    header_size: int
    body_size: int
    entries: tuple[FatbinEntry, ...]


# ---------------------------------------------------------------- ELF and fatbin parsing


def find_elf_section(data: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of the named section of a 64-bit little-endian ELF file."""
    if data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise ShrinkError("not a 64-bit little-endian ELF file")
    (section_table,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        fields = struct.unpack_from("<IIQQQQIIQQ", data, section_table + index * entry_size)
        return fields[0], fields[4], fields[5]  # name offset, file offset, size

    names_offset = section(names_index)[1]
    for index in range(count):
        name_offset, offset, size = section(index)
        start = names_offset + name_offset
        if data[start : data.index(b"\0", start)].decode() == name:
            return offset, size
    raise ShrinkError(f"the ELF file has no {name} section")


def parse_entry(data: bytes, offset: int) -> FatbinEntry:
    kind, _version, header_size, payload_size = ENTRY_PREFIX.unpack_from(data, offset)
    (compressed_size,) = struct.unpack_from("<I", data, offset + 16)
    (arch,) = struct.unpack_from("<I", data, offset + 28)
    (flags,) = struct.unpack_from("<Q", data, offset + 40)
    (decompressed_size,) = struct.unpack_from("<Q", data, offset + 56)
    return FatbinEntry(offset, kind, header_size, payload_size, compressed_size, arch, flags, decompressed_size)


def parse_container(data: bytes, offset: int) -> FatbinContainer:
    magic, _version, header_size, body_size = CONTAINER_HEADER.unpack_from(data, offset)
    if magic != CONTAINER_MAGIC:
        raise ShrinkError(f"no fatbin container magic at file offset {offset:#x}")
    entries = []
    position, end = offset + header_size, offset + header_size + body_size
    while position < end:
        entry = parse_entry(data, position)
        entries.append(entry)
        position = entry.payload_offset + entry.payload_size
    if position != end:
        raise ShrinkError(f"the entries of the container at {offset:#x} overrun its declared size")
    return FatbinContainer(offset, header_size, body_size, tuple(entries))


def parse_fatbin(data: bytes, section_offset: int, section_size: int) -> list[FatbinContainer]:
    """All containers of a .nv_fatbin section, in file order."""
    containers = []
    position, end = section_offset, section_offset + section_size
    while position < end:
        if data[position : position + 4] == bytes(4):  # alignment padding between containers
            position += 4
            continue
        container = parse_container(data, position)
        containers.append(container)
        position = container.offset + container.header_size + container.body_size
    if position != end:
        raise ShrinkError("the fatbin containers overrun the .nv_fatbin section")
    return containers


# ---------------------------------------------------------------- the stand-in payload


def zstd_head(frame: bytes, count: int) -> bytes:
    """The first `count` decompressed bytes of a zstd frame, without decompressing all of it."""
    if shutil.which("zstd") is None:
        raise ShrinkError("the zstd command-line tool is needed (apt-get install zstd)")
    process = subprocess.Popen(
        ["zstd", "-d", "-c", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )

    def feed() -> None:  # in a thread: zstd stops reading once we stop reading its output
        try:
            process.stdin.write(frame)
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    feeder = threading.Thread(target=feed)
    feeder.start()
    head = process.stdout.read(count)
    process.kill()
    feeder.join()
    process.wait()
    process.stdout.close()
    return head


def empty_cubin_head(elf_header: bytes) -> bytes:
    """The cubin's own ELF header, re-pointed at a section table holding only a null and a .shstrtab section."""
    if len(elf_header) != ELF_HEADER_SIZE or elf_header[:4] != ELF_MAGIC:
        raise ShrinkError("a dropped cubin does not decompress to an ELF file")
    names = b"\0.shstrtab\0".ljust(16, b"\0")
    names_offset, table_offset = ELF_HEADER_SIZE, ELF_HEADER_SIZE + len(names)
    header = bytearray(elf_header)
    struct.pack_into("<QQ", header, 0x20, 0, table_offset)  # no program headers; sections after the names
    struct.pack_into("<HHHHHH", header, 0x34, ELF_HEADER_SIZE, 56, 0, 64, 2, 1)
    names_section = struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_offset, 11, 0, 0, 1, 0)  # SHT_STRTAB
    return bytes(header) + names + bytes(64) + names_section


def zstd_frame_of_zeros_after(head: bytes, content_size: int) -> bytes:
    """A zstd frame decompressing to `head` then zeros, `content_size` bytes in all: one raw block, then RLE blocks."""
    if not 0 < len(head) <= min(content_size, ZSTD_MAX_BLOCK):
        raise ShrinkError(f"a {content_size}-byte cubin is too small for the {len(head)}-byte stand-in")
    # Frame header descriptor 0xE0: 8-byte content size, single segment (no window descriptor), no checksum.
    frame = bytearray(struct.pack("<IBQ", int.from_bytes(ZSTD_MAGIC, "little"), 0xE0, content_size))
    zeros = content_size - len(head)
    frame += block_header(last=zeros == 0, block_type=0, size=len(head)) + head
    while zeros:
        run = min(zeros, ZSTD_MAX_BLOCK)
        zeros -= run
        frame += block_header(last=zeros == 0, block_type=1, size=run) + b"\0"
    return bytes(frame)


def block_header(last: bool, block_type: int, size: int) -> bytes:
    """3-byte zstd block header: last-block bit, type (0 raw, 1 RLE), size."""
    return struct.pack("<I", int(last) | block_type << 1 | size << 3)[:3]


def stand_in_payload(original: bytes, entry: FatbinEntry) -> bytes:
    """The replacement for a dropped entry's payload, exactly `entry.payload_size` bytes long."""
    if entry.kind != CUBIN_KIND or entry.compressed_size == 0 or original[:4] != ZSTD_MAGIC:
        raise ShrinkError(
            f"entry at {entry.offset:#x} ({entry.arch_name}, kind {entry.kind}) is not a zstd-compressed cubin"
        )
    head = empty_cubin_head(zstd_head(original[: entry.compressed_size], ELF_HEADER_SIZE))
    frame = zstd_frame_of_zeros_after(head, entry.decompressed_size)
    gap = entry.compressed_size - len(frame)
    if gap < 0 or 0 < gap < 8:  # a skippable frame needs 8 bytes of its own
        raise ShrinkError(f"entry at {entry.offset:#x}: no room for a stand-in in {entry.compressed_size} bytes")
    if gap:
        frame += struct.pack("<II", ZSTD_SKIPPABLE_MAGIC, gap - 8) + bytes(gap - 8)
    return frame + bytes(entry.payload_size - entry.compressed_size)


# ---------------------------------------------------------------- shrinking and the wheel


def shrink_library(data: bytes, keep_archs: set[int]) -> tuple[bytes, list[FatbinEntry]]:
    """The library with every cubin whose arch is not in `keep_archs` replaced; also all entries, for the table."""
    section_offset, section_size = find_elf_section(data, FATBIN_SECTION)
    entries = [e for c in parse_fatbin(data, section_offset, section_size) for e in c.entries]
    shrunk = bytearray(data)
    for entry in entries:
        if entry.arch in keep_archs:
            continue
        start, end = entry.payload_offset, entry.payload_offset + entry.payload_size
        shrunk[start:end] = stand_in_payload(data[start:end], entry)
    assert len(shrunk) == len(data)
    return bytes(shrunk), entries


def record_hash(content: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def updated_record(record: bytes, member: str, content: bytes) -> bytes:
    """The wheel's RECORD with the line of `member` carrying the new hash and size."""
    lines = record.decode().split("\n")
    matches = [i for i, line in enumerate(lines) if line.startswith(member + ",")]
    if len(matches) != 1:
        raise ShrinkError(f"RECORD lists {member} {len(matches)} times, expected once")
    lines[matches[0]] = f"{member},{record_hash(content)},{len(content)}"
    return "\n".join(lines).encode()


def rewrite_wheel(source: zipfile.ZipFile, destination: str, member: str, content: bytes) -> None:
    """Copy the wheel with `member` replaced, same member order, dates and modes, deflated at level 9."""
    with zipfile.ZipFile(destination, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename == member:
                data = content
            elif info.filename.endswith(".dist-info/RECORD"):
                data = updated_record(data, member, content)
            copied = zipfile.ZipInfo(info.filename, info.date_time)
            copied.external_attr = info.external_attr
            out.writestr(copied, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)


def arch_table(entries: list[FatbinEntry], keep_archs: set[int]) -> str:
    """Per-architecture count, payload and decompressed bytes, and whether it was kept."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    arch_of = {}
    for entry in entries:
        row = totals[entry.arch_name]
        row[0] += 1
        row[1] += entry.payload_size
        row[2] += entry.decompressed_size
        arch_of[entry.arch_name] = entry.arch
    lines = [f"{'arch':8} {'entries':>7} {'payload B':>12} {'decompressed B':>15}  action"]
    for name in sorted(totals, key=lambda n: (arch_of[n], n)):
        count, payload, decompressed = totals[name]
        action = "kept" if arch_of[name] in keep_archs else "stubbed"
        lines.append(f"{name:8} {count:7} {payload:12} {decompressed:15}  {action}")
    kept = sum(e.payload_size for e in entries if e.arch in keep_archs)
    lines.append(f"payload bytes kept {kept} of {sum(e.payload_size for e in entries)}")
    return "\n".join(lines)


def shrink_wheel(source_path: str, destination_path: str, keep_archs: set[int], member: str = SO_MEMBER) -> str:
    """Write the shrunk wheel (via a temporary file, so a failure leaves nothing behind); return the arch table."""
    with zipfile.ZipFile(source_path) as source:
        if member not in source.namelist():
            raise ShrinkError(f"{source_path} has no member {member}")
        shrunk, entries = shrink_library(source.read(member), keep_archs)
        temporary = destination_path + ".partial"
        try:
            rewrite_wheel(source, temporary, member, shrunk)
            os.replace(temporary, destination_path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
    return arch_table(entries, keep_archs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="transformer_engine_cu13-*.whl as downloaded from PyPI")
    parser.add_argument("destination", help="where to write the shrunk wheel (keep the original file name)")
    parser.add_argument("--keep-arch", type=int, action="append", help="arch number to keep (repeatable; default 90)")
    parser.add_argument("--member", default=SO_MEMBER, help="the library inside the wheel")
    args = parser.parse_args(argv)
    if os.path.abspath(args.source) == os.path.abspath(args.destination):
        parser.error("the destination must differ from the source")
    if not os.path.isfile(args.source):
        parser.error(f"no such wheel: {args.source}")
    try:
        table = shrink_wheel(args.source, args.destination, set(args.keep_arch or [90]), args.member)
    except (ShrinkError, zipfile.BadZipFile) as error:
        print(f"shrink_te_core: {error}", file=sys.stderr)
        return 1
    print(table)
    sizes = os.path.getsize(args.source), os.path.getsize(args.destination)
    print(f"{args.source}: {sizes[0]} B -> {args.destination}: {sizes[1]} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
