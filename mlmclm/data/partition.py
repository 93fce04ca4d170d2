"""Partitioned preparation: N independent jobs, then one merge.

Documents are numbered in input order and cut into groups of `group_docs`; job I of N prepares the groups g with
g % N == I (`PrepareConfig.wanted`). Every group is packed from a row boundary, so its full rows are the same
whichever job packs it. What is left of a group after its last full row (its *tail*, less than a row) is saved,
unpacked, in the part's `tails.npz`; the merge packs all tails in group order — exactly what a single run does at
the end of its stream — into `tails-NNNNNN.tar`, and writes one manifest over the parts' shards and those. The
merged dataset therefore holds the same rows as a single run of the same inputs (in another shard order).

Layout: `OUT/part-IIIII-of-NNNNN/{shard-*.tar, tails.npz, manifest.json}`, then `OUT/manifest.json` +
`OUT/tails-*.tar` from the merge (shards named by their path relative to OUT).
"""
from __future__ import annotations

import glob
import logging
import os
import zipfile
from pathlib import Path

import numpy as np

from mlmclm.atomic_write import atomic_file
from mlmclm.bounded_read import FileRefusedError, open_regular_file
from mlmclm.data.manifest import MANIFEST_NAME, Manifest, ShardInfo, check_relative_name
from mlmclm.data.packing import Packer   # the packing a single run uses for its tails
from mlmclm.data.shards import ShardError, read_shard_starts, token_checksum, write_shard
from mlmclm.data.tokenizer import check_same_tokenizer
from mlmclm.redact import redact

log = logging.getLogger(__name__)
PART_PATTERN = "part-{:05d}-of-{:05d}"
VALIDATION_DIR = "validation"   # the held-out split's directory beside the training rows (mlmclm.data.prepare)
TAILS_NAME = "tails.npz"


class MergeError(ValueError):
    """A part cannot be merged; the message names it."""


def write_tails(out: Path, tails: list[tuple[int, np.ndarray, np.ndarray]]) -> dict:
    """Save (group, tokens, document starts) tails as `out/tails.npz` (temporary name, then rename); returns the
    manifest's `tails` record."""
    groups = np.array([g for g, _, _ in tails], np.int64)
    lengths = np.array([len(t) for _, t, _ in tails], np.int64)
    tokens = np.concatenate([t for _, t, _ in tails]).astype(np.int32) if tails else np.zeros(0, np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if tails else lengths
    starts = [s + o for (_, _, s), o in zip(tails, offsets)]
    start_counts = np.array([len(s) for s in starts], np.int64)
    starts = np.concatenate(starts).astype(np.int64) if tails else np.zeros(0, np.int64)
    with atomic_file(out / TAILS_NAME, "wb") as stream:   # created exclusively: never a planted link
        np.savez(stream, groups=groups, lengths=lengths, tokens=tokens, starts=starts, start_counts=start_counts)
    return {"name": TAILS_NAME, "groups": len(tails), "tokens": int(lengths.sum()),
            "checksum": token_checksum(tokens)}


def read_tails(part: Manifest) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The tails a part saved, checked against its manifest (MergeError naming the part otherwise)."""
    path = Path(part.shard_url(part.tails["name"]))
    # A regular file no larger than its manifest's counts allow (groups and lengths int64, tokens int32, at most
    # one int64 start per token), and no member that unpacks to more (a compressed member could).
    try:
        limit = 24 * int(part.tails["groups"]) + 12 * int(part.tails["tokens"]) + (1 << 20)
        with open_regular_file(path, limit, "tails file") as stream:
            unpacked = sum(member.file_size for member in zipfile.ZipFile(stream).infolist())
            if unpacked > limit:
                raise FileRefusedError(f"{path}: refusing to read this tails file: its arrays unpack to "
                                       f"{unpacked} bytes, more than the {limit} its manifest allows")
            stream.seek(0)
            with np.load(stream, allow_pickle=False) as data:
                groups, lengths, tokens = data["groups"], data["lengths"], data["tokens"]
                starts, start_counts = data["starts"], data["start_counts"]
    except FileRefusedError as err:
        raise MergeError(f"part {part.location}: {err}") from err
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
        raise MergeError(f"part {part.location}: cannot read {path}: {err}") from err
    if (len(groups) != part.tails["groups"] or int(lengths.sum()) != part.tails["tokens"]
            or len(tokens) != part.tails["tokens"] or token_checksum(tokens) != part.tails["checksum"]):
        raise MergeError(f"part {part.location}: {path} does not match its manifest (corrupt or replaced: "
                         f"checksum or counts differ)")
    token_ends, start_ends = np.cumsum(lengths), np.cumsum(start_counts)
    result = []
    for g, t_end, length, s_end, count in zip(groups.tolist(), token_ends, lengths, start_ends, start_counts):
        lo = t_end - length
        result.append((g, tokens[lo:t_end], starts[s_end - count:s_end] - lo))
    return result


def find_parts(output_dir: str | os.PathLike) -> list[Path]:
    parts = sorted(Path(p) for p in glob.glob(str(Path(output_dir) / "part-*-of-*")) if Path(p).is_dir())
    if not parts:
        raise MergeError(f"{output_dir}: no part-*-of-* directories to merge")
    return parts


def merge(output_dir: str | os.PathLike, parts: list[str | os.PathLike] | None = None, verify: bool = True,
          samples_per_shard: int = 4096, rows_per_block: int = 256, command: str = "") -> Manifest:
    """Check the parts (same tokenizer, sequence length, dtype and grouping; all N present once; shard and tail
    checksums unless `verify` is false) and write `output_dir/manifest.json` over all of them."""
    out = Path(output_dir)
    part_dirs = [Path(p) for p in parts] if parts else find_parts(out)
    manifests = []
    for part_dir in part_dirs:
        try:
            m = Manifest.load(part_dir)
        except ValueError as err:
            raise MergeError(f"part {part_dir}: {err}") from err
        if m.partition is None or m.tails is None:
            raise MergeError(f"part {part_dir}: not a partition (prepared without --num-partitions)")
        manifests.append(m)
    manifests.sort(key=lambda m: m.partition["index"])
    for m in manifests:   # the merged manifest names them relative to `out`: Manifest.load must accept those names
        part_dir = Path(m.location).parent
        try:
            check_relative_name(os.path.relpath(part_dir, out), f"part {part_dir}")
        except ValueError as err:
            raise MergeError(f"{err}. The merged manifest names each part relative to {out}, so a part must lie "
                             f"under it, in a folder of plain name (as --output {out} --partition I lays them out)"
                             ) from err
    first = manifests[0]
    count = first.partition["count"]
    for m in manifests:
        where = f"part {Path(m.location).parent}"
        try:
            check_same_tokenizer(m.tokenizer, first.tokenizer, where=where)
        except ValueError as err:
            raise MergeError(str(err)) from err
        for key in ("seq_length", "dtype"):
            if getattr(m, key) != getattr(first, key):
                raise MergeError(f"{where}: {key} is {getattr(m, key)}, other parts have {getattr(first, key)}")
        for key in ("count", "group_docs"):
            if m.partition[key] != first.partition[key]:
                raise MergeError(f"{where}: partition {key} is {m.partition[key]}, other parts have "
                                 f"{first.partition[key]}")
    indices = [m.partition["index"] for m in manifests]
    if indices != list(range(count)):
        missing = sorted(set(range(count)) - set(indices))
        doubles = sorted({i for i in indices if indices.count(i) > 1})
        raise MergeError(f"parts of {count} partitions: missing {missing}, given twice {doubles}")

    S, pad_id = first.seq_length, first.tokenizer.get("pad_id")
    shards: list[ShardInfo] = []
    all_tails = []
    for m in manifests:
        part_dir = Path(m.location).parent
        for info in m.shards:
            if verify:
                try:
                    read_shard_starts(m.shard_url(info.name), info, S, pad_id, m.dtype, m.tokenizer.get("vocab_size"))
                except ShardError as err:
                    raise MergeError(f"part {part_dir}: {err}") from err
            name = os.path.relpath(part_dir / info.name, out)
            shards.append(ShardInfo(name=name, num_samples=info.num_samples, num_tokens=info.num_tokens,
                                    checksum=info.checksum))
        all_tails.extend(read_tails(m))
    all_tails.sort(key=lambda t: t[0])

    (out / MANIFEST_NAME).unlink(missing_ok=True)   # checked: from here on the output is rewritten
    packer = Packer(S, first.tokenizer["bos_id"], first.tokenizer["eos_id"])
    for _, tokens, starts in all_tails:
        packer.add_tail(tokens, starts)
    tokens, starts = packer.rows(final=True, pad_id=pad_id)
    tail_shards = []
    for k, lo in enumerate(range(0, len(tokens), samples_per_shard)):
        hi = min(lo + samples_per_shard, len(tokens))
        blocks = []
        for b_lo in range(lo, hi, rows_per_block):
            b_hi = min(b_lo + rows_per_block, hi)
            sel = starts[(starts >= b_lo * S) & (starts < b_hi * S)]
            blocks.append((tokens[b_lo:b_hi], sel - b_lo * S))
        tail_shards.append(write_shard(out / f"tails-{k:06d}.tar", blocks, pad_id, first.dtype))
    for old in out.glob("tails-*.tar"):   # of an earlier merge with more tail rows
        if old.name not in {s.name for s in tail_shards}:
            old.unlink()
    shards.extend(tail_shards)
    if not shards:
        raise MergeError(f"{out}: the parts hold no data")
    merged = Manifest(
        seq_length=S, num_samples=sum(s.num_samples for s in shards), num_tokens=sum(s.num_tokens for s in shards),
        tokenizer=first.tokenizer, shards=shards, num_documents=sum(m.num_documents for m in manifests),
        dtype=first.dtype, command=redact(command or f"merge({out})"),
        inputs=list(dict.fromkeys(i for m in manifests for i in m.inputs)),   # every part lists the same inputs
        parts=[os.path.relpath(Path(m.location).parent, out) for m in manifests],
    )
    held_out = [m.validation for m in manifests]
    if any(held_out):
        if not all(held_out) or len({v["every"] for v in held_out}) > 1:
            raise MergeError("the parts disagree on their validation split (prepared with different "
                             "--validation-every): " + ", ".join(f"{Path(m.location).parent.name}: "
                                                                 f"{(m.validation or {}).get('every')}"
                                                                 for m in manifests))
        split_parts = [Path(m.location).parent / v["path"] for m, v in zip(manifests, held_out)]
        split = merge(out / VALIDATION_DIR, [p.parent for p in split_parts], verify, samples_per_shard,
                      rows_per_block, f"{command or f'merge({out})'} (validation split)")
        merged.validation = {"path": os.path.relpath(split.location, out), "every": held_out[0]["every"],
                             "num_documents": split.num_documents, "num_samples": split.num_samples,
                             "num_tokens": split.num_tokens}
    merged.save(out)
    merged.location = str(out / MANIFEST_NAME)
    log.info("merged %d parts: %d samples (%d from tails), %d tokens, %d documents under %s", len(manifests),
             merged.num_samples, sum(s.num_samples for s in tail_shards), merged.num_tokens,
             merged.num_documents, out)
    return merged
