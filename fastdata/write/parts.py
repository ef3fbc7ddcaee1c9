"""Part-by-part conversion for clusters without Ray: ``convert --part I/N`` writes each part's shards and a part
record; ``merge-parts`` checks the records and writes the manifest (docs/scale.md). DST may be a URL."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastdata.errors import DataError, DestinationBusyError, RemoteError, UsageError
from fastdata.fileio import file_checksum, fsync_dir, lock_holder, write_atomic
from fastdata.format import MANIFEST_NAME, Manifest, ShardInfo
from fastdata.format.manifest import PART_FILE, PART_RECORD, SKIPPED_NAME, parse_manifest, write_manifest
from fastdata.remote import RemoteOptions, is_url, join, root
from fastdata.write.destination import DstLock, own_files, refuse_broken_url, write_skipped
from fastdata.write.shard_task import UrlSpec

RECORD_VERSION = 1
_PART_ARG = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
MAX_RECORD_BYTES = 256 << 20
log = logging.getLogger(__name__)


def parse_part(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N); I counts from 0 (as SLURM array indices and Spark partitions do). The text of the
    CLI's ``--part`` flag, which its errors name (from Python, ``ConvertConfig(part=(I, N))``)."""
    m = _PART_ARG.match(text)
    if not m:
        raise UsageError(f"--part {text!r}: expected I/N, e.g. 0/4 (part I of N, I from 0 to N-1)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or n > 99999:
        raise UsageError(f"--part {text}: N must be 1 to 99999")
    if i >= n:
        raise UsageError(f"--part {text}: I counts from 0 to N-1 = {n - 1} (SLURM: --array=0-{n - 1})")
    return i, n


def write_part_record(dst: Path, part: tuple[int, int], head: dict[str, Any], manifest: Manifest,
                      skipped: list[tuple[str, str]]) -> None:
    """The record of a finished part: the conversion it belongs to (the journal header), the manifest
    a whole conversion would write with this part's shards only, and the skipped files."""
    record = {
        "fastdata_part": RECORD_VERSION, "part": part[0], "parts": part[1], "conversion": head,
        "manifest": manifest.to_json(), "skipped": [list(s) for s in skipped],
    }
    text = json.dumps(record) + "\n"  # key order kept: the manifest must come out byte-identical
    write_atomic(dst / own_files(part)[2], lambda f: f.write(text.encode("utf-8")))
    fsync_dir(dst)


@dataclass
class MergePartsReport:
    dst: Path | str
    parts: int
    shards: int
    samples: int
    seconds: float

    def summary(self) -> str:
        return (f"merged {self.parts} part(s) into {self.dst}: {self.samples} samples in {self.shards} shard(s), "
                f"manifest written ({self.seconds:.1f} s)")


def merge_parts(dst: str | os.PathLike[str], remote: RemoteOptions | None = None) -> MergePartsReport:
    """Check that every part of a ``--part I/N`` conversion into ``dst`` (a folder, or a URL with ``remote``) is
    present, complete and of one conversion; then write the manifest (last) and skipped.json, remove the records."""
    t0 = time.perf_counter()
    if isinstance(dst, str) and is_url(dst):  # checked before Path(), which would collapse "s3://b" into "s3:/b"
        return _merge_url(root(dst), remote or RemoteOptions(), t0)
    if remote is not None:
        raise UsageError(f"{dst}: %(remote) options apply to URL destinations only, and this is a local path")
    if "://" in str(dst):
        raise UsageError(f"{dst}: not a local folder (a URL must be given as a string)")
    refuse_broken_url(dst)
    dst = Path(dst)
    if not dst.is_dir():
        raise UsageError(f"{dst}: no such folder")
    with DstLock(dst):  # a second merge-parts (or a whole conversion) waits its turn
        return _merge_locked(dst, t0)


def _merge_locked(dst: Path, t0: float) -> MergePartsReport:
    sizes = {e.name: e.stat().st_size for e in os.scandir(dst) if e.is_file()}
    for e in sizes:
        m = PART_FILE.match(e)
        if m and e.endswith(".lock"):
            who = lock_holder(dst / e)
            if who is not None:
                raise DestinationBusyError(f"{dst}: part {int(m.group(1))}/{int(m.group(2))} is still being "
                                           f"converted ({who}); run merge-parts after every part has ended")
    manifest, skipped, n = _combine(str(dst), lambda name: str(dst / name), sizes, lambda name: (dst / name).read_bytes())
    _check_keys_file(manifest, sizes, lambda name: str(dst / name), dst)
    write_skipped(dst, skipped)
    write_manifest(dst, manifest)  # the dataset is complete from here; the records are only clutter
    for i in range(n):
        for name in own_files((i, n))[1:]:  # its lock and record
            (dst / name).unlink(missing_ok=True)
    return MergePartsReport(dst, n, len(manifest.shards), manifest.num_samples, time.perf_counter() - t0)


def _merge_url(url: str, options: RemoteOptions, t0: float) -> MergePartsReport:
    """merge-parts on a URL: the same checks on the uploaded records and objects (sizes from one
    listing), then skipped.json and the manifest uploaded, the manifest last."""
    spec = UrlSpec(url, options)
    fs = spec.filesystem()
    sizes = spec.sizes(fs)
    manifest, skipped, n = _combine(url, lambda name: join(url, name), sizes, lambda name: spec.read(name, fs))
    _check_keys_file(manifest, sizes, lambda name: join(url, name))
    with tempfile.TemporaryDirectory(prefix="fastdata-merge-") as tmp:
        local = Path(tmp)
        write_skipped(local, skipped)
        write_manifest(local, manifest)  # the bytes a folder's merge-parts (and a whole conversion) writes
        if (local / SKIPPED_NAME).is_file():
            spec.upload(local / SKIPPED_NAME, SKIPPED_NAME, fs)
        spec.upload(local / MANIFEST_NAME, MANIFEST_NAME, fs)  # the dataset is complete from here
    for name in sorted(sizes):
        m = PART_FILE.match(name)
        if m and int(m.group(2)) == n:  # records and any journal left behind: clutter now
            try:
                spec.remove(name, fs)
            except RemoteError as e:
                log.warning("%s: could not remove %s: %s", url, name, e)
    return MergePartsReport(url, n, len(manifest.shards), manifest.num_samples, time.perf_counter() - t0)


def _combine(dst: str, path_of: Callable[[str], str], sizes: dict[str, int],
             read: Callable[[str], bytes]) -> tuple[Manifest, list[tuple[str, str]], int]:
    """The checks of merge-parts (``sizes``: every file there; ``read``: one's bytes): no manifest yet, every part once,
    one conversion, the plan covered, each shard its recorded size. Returns (manifest, skipped, N)."""
    if MANIFEST_NAME in sizes:
        raise UsageError(f"{dst}: already holds a finished dataset (manifest.json); nothing to merge")
    records = []
    for name in sorted(sizes):
        if PART_RECORD.match(name):
            if sizes[name] > MAX_RECORD_BYTES:
                raise DataError(f"{path_of(name)}: part record too large to be one of ours")
            records.append(_parse_record(read, name, path_of(name)))
    if not records:
        raise UsageError(f"{dst}: no part records (.fastdata-part-*.json): convert the parts first "
                         "(fastdata convert SRC DST %(part=I/N))")
    counts = sorted({r["parts"] for r in records})
    if len(counts) > 1:
        raise UsageError(f"{dst}: holds parts of conversions split in {' and '.join(map(str, counts))} parts: "
                         "duplicated parts from two runs; remove the stale records (.fastdata-part-*-of-N.json) "
                         "and their shards, or convert again into a new folder")
    n = counts[0]
    by_index: dict[int, dict[str, Any]] = {}
    for r in records:
        if r["part"] in by_index:
            raise UsageError(f"{dst}: part {r['part']}/{n} is recorded twice ({r['_file']} and "
                             f"{by_index[r['part']]['_file']}); remove one")
        by_index[r["part"]] = r
    missing = [i for i in range(n) if i not in by_index]
    if missing:
        shown = ", ".join(f"{i}/{n}" for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise UsageError(f"{dst}: {len(missing)} of {n} part(s) missing or unfinished: {shown}; run "
                         f"fastdata convert SRC {dst} %(part=I/{n}) for each (%(resume=True) for an interrupted one)")
    first = by_index[0]
    for i in range(1, n):
        _check_same_conversion(dst, first, by_index[i])
    plan = first["conversion"]["shards"]
    claimed: dict[str, int] = {}
    shards: list[ShardInfo] = []
    for i in range(n):
        for s in by_index[i]["manifest"]["shards"]:
            if s["file"] in claimed:
                raise UsageError(f"{dst}: shard {s['file']} is claimed by part {claimed[s['file']]}/{n} and part "
                                 f"{i}/{n} (duplicated part); convert again into a new folder")
            claimed[s["file"]] = i
            shards.append(ShardInfo(**s))
    planned = [p[0] for p in plan]
    absent = [name for name in planned if name not in claimed]
    if absent or len(claimed) != len(planned):
        raise UsageError(f"{dst}: the parts do not cover the shard plan (first missing: "
                         f"{absent[0] if absent else '?'}); convert again into a new folder")
    for s in shards:
        _check_shard_file(path_of(s.file), sizes.get(s.file), s, claimed[s.file], n)
    obj = dict(first["manifest"])
    obj["shards"] = [s.to_json() for s in sorted(shards, key=lambda s: s.start)]
    manifest = parse_manifest(obj, where=dst)  # validates: contiguous, every sample covered
    return manifest, [(str(p), str(r)) for p, r in first["skipped"]], n


def _parse_record(read: Callable[[str], bytes], name: str, where: str) -> dict[str, Any]:
    try:
        r = json.loads(read(name).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"{where}: unreadable part record ({e}); convert that part again with %(overwrite=True)") from None
    m = PART_FILE.match(name)  # a record's name: PART_RECORD matched it
    ok = (isinstance(r, dict) and r.get("fastdata_part") == RECORD_VERSION and m is not None
          and r.get("part") == int(m.group(1)) and r.get("parts") == int(m.group(2))
          and isinstance(r.get("conversion"), dict) and isinstance(r.get("manifest"), dict)
          and isinstance(r["manifest"].get("shards"), list) and isinstance(r.get("skipped"), list))
    if not ok:
        raise DataError(f"{where}: not a part record this fastdata wrote; convert that part again with %(overwrite=True)")
    r["_file"] = name
    return r


def _difference(ca: dict[str, Any], cb: dict[str, Any]) -> str | None:
    """What differs between two conversions (journal headers), or None."""
    for key, what in (("options", "options"), ("source", "source"), ("fingerprint", "source files"),
                      ("shards", "shard plan")):
        if ca.get(key) != cb.get(key):
            return what
    return None


def check_other_parts(dst: Path, part: tuple[int, int], head: dict[str, Any]) -> None:
    """Refuse part ``part`` of the conversion ``head`` before it writes anything when DST holds another part
    (finished or interrupted) of another conversion: its shards would replace that part's under their names."""
    for name in sorted(os.listdir(dst)):
        m = PART_FILE.match(name)
        other = (int(m.group(1)), int(m.group(2))) if m else part
        journal, _, record = own_files(other)
        if other == part or name not in (journal, record):  # only the other parts' journals and records
            continue
        try:
            r = json.loads((dst / name).read_bytes().split(b"\n")[0])
            conversion = r.get("conversion", r) if isinstance(r, dict) else None
        except (OSError, ValueError, RecursionError):
            continue  # unreadable: merge-parts names it
        what = _difference(conversion, head) if isinstance(conversion, dict) else None
        if what is not None:
            raise UsageError(f"{dst}: holds part {other[0]}/{other[1]} of another conversion (different {what}); "
                             f"run part {part[0]}/{part[1]} with the same SRC and options as the other parts "
                             "(or convert into a new folder)")


def _check_same_conversion(dst: str, a: dict[str, Any], b: dict[str, Any]) -> None:
    what = _difference(a["conversion"], b["conversion"])
    if what is not None:
        raise UsageError(f"{dst}: part {b['part']}/{b['parts']} comes from another conversion than part "
                         f"{a['part']}/{a['parts']} (different {what}); convert every part with the same SRC "
                         "and options (convert the odd one again with %(overwrite=True))")
    ma = {k: v for k, v in a["manifest"].items() if k != "shards"}
    mb = {k: v for k, v in b["manifest"].items() if k != "shards"}
    if ma != mb:
        raise UsageError(f"{dst}: part {b['part']}/{b['parts']} and part {a['part']}/{a['parts']} describe "
                         "different datasets (fastdata versions?); convert them with the same fastdata")


def _check_keys_file(manifest: Manifest, sizes: dict[str, int], path_of: Callable[[str], str],
                     local: Path | None = None) -> None:
    """The sample keys' file every part wrote (the same bytes) is in place with the recorded size, and in a
    folder ``local`` the recorded checksum."""
    keys = manifest.keys
    if keys is None or keys.file is None:
        return
    got = sizes.get(keys.file)
    if got != keys.bytes:
        raise DataError(f"{path_of(keys.file)}: {'missing' if got is None else f'is {got} bytes, not {keys.bytes}'}"
                        ", though the parts list it; convert any one part again with %(overwrite=True)")
    if local is not None and file_checksum(local / keys.file, str(keys.checksum).partition(":")[0]) != keys.checksum:
        raise DataError(f"{local / keys.file}: is not the keys file the parts recorded (its checksum differs); "
                        "convert any one part again with %(overwrite=True)")


def _check_shard_file(where: str, size: int | None, s: ShardInfo, part: int, n: int) -> None:
    """The shard is in place with the size the part recorded (``fastdata verify`` checks hashes)."""
    if size is None:
        raise DataError(f"{where}: missing, though part {part}/{n} recorded it; convert that part "
                        "again with %(overwrite=True)")
    if size != s.bytes:
        raise DataError(f"{where}: is {size} bytes, part {part}/{n} recorded {s.bytes}; convert that "
                        "part again with %(overwrite=True)")


__all__ = ["MergePartsReport", "merge_parts", "parse_part", "write_part_record"]
