"""The conversion journal (JSON lines) for ``--resume``: a header describing the conversion, then one line per
finished shard; a torn last line is ignored, and a journal of another conversion refused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fastdata._version import __version__
from fastdata.errors import UsageError
from fastdata.fileio import finish_file, fsync_dir
from fastdata.format import ShardInfo
from fastdata.format.manifest import JOURNAL_NAME
from fastdata.format.spec import parse_checksum
from fastdata.write import _fault

__all__ = ["JOURNAL_VERSION", "MAX_JOURNAL_BYTES", "append", "check_same", "fingerprint", "header", "load", "remove",
           "start"]

JOURNAL_VERSION = 1
MAX_JOURNAL_BYTES = 1 << 30


def header(source: Any, options: dict[str, Any], plan: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
    """The journal's first line for converting ``source`` with ``options`` into shards ``plan``
    (``(file, start, count)`` each)."""
    return {
        "journal": JOURNAL_VERSION,
        "fastdata_version": __version__,
        "options": options,
        "source": source.describe(),
        "fingerprint": fingerprint(source),
        "shards": [list(p) for p in plan],
    }


def fingerprint(source: Any) -> str:
    """SHA-256 over what the output depends on: schema, sample sizes, labels, and the size and
    modification time of every input file (a changed file changes one of them)."""
    h = hashlib.sha256()

    def put(obj: Any) -> None:
        h.update(json.dumps(obj, sort_keys=True, default=str).encode())
        h.update(b"\0")

    put([f.to_json() for f in source.fields])
    put(source.classes)
    put(len(source))
    h.update(np.ascontiguousarray(source.sample_nbytes(), dtype="<i8").tobytes())
    for f in source.fields:
        rows = source.ragged_rows(f.name) if f.ragged else None
        if rows is not None:  # None: known only when read (Python objects)
            h.update(np.ascontiguousarray(rows, dtype="<i8").tobytes())
    files, values = source.inputs()
    for v in values:
        h.update(np.ascontiguousarray(v).tobytes())
    for path in files:
        try:
            st = os.stat(path)
            put([path, st.st_size, st.st_mtime_ns])
        except OSError:
            put([path, None])
    return h.hexdigest()


def start(dst: Path, head: dict[str, Any], name: str = JOURNAL_NAME) -> None:
    """Write a new journal holding only ``head`` (atomically: it exists whole or not at all).
    ``name``: the journal's file name (each ``--part`` of a conversion has its own)."""
    path = dst / name
    tmp = dst / f"{name}.tmp"
    try:
        tmp.write_text(json.dumps(head, sort_keys=True) + "\n", encoding="utf-8")
        _fault.point("mid_journal")
        finish_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dst)


def append(dst: Path, info: ShardInfo, name: str = JOURNAL_NAME) -> None:
    """Record a finished shard (already renamed into place and fsynced)."""
    line = (json.dumps(info.to_json(), sort_keys=True) + "\n").encode()
    fd = os.open(dst / name, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def load(dst: Path, name: str = JOURNAL_NAME, shown: str | None = None) -> tuple[dict[str, Any], dict[str, ShardInfo]]:
    """The journal's header and its finished shards by file name (the last record of each wins). ``shown``: where
    errors say DST is (a URL, whose journal this is a copy of)."""
    path = dst / name
    where = f"{shown or dst}/{name}"
    try:
        if path.stat().st_size > MAX_JOURNAL_BYTES:
            raise UsageError(f"{where}: journal is too large to be one of ours; convert again with %(overwrite=True)")
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise UsageError(f"{where}: cannot read the conversion journal: {e.strerror}") from None
    try:
        head = json.loads(lines[0])
    except (ValueError, RecursionError):
        head = None
    if not isinstance(head, dict) or head.get("journal") != JOURNAL_VERSION:
        raise UsageError(f"{where}: not a journal this fastdata can resume from; convert again with %(overwrite=True)")
    done: dict[str, ShardInfo] = {}
    for raw in lines[1:-1]:  # the part after the last newline is a torn append, or empty
        info = _parse_entry(raw)
        if info is not None:
            done[info.file] = info
    return head, done


def _parse_entry(raw: bytes) -> ShardInfo | None:
    try:
        e = json.loads(raw)
        info = ShardInfo(file=e["file"], start=e["start"], count=e["count"], bytes=e["bytes"], checksum=e["checksum"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    ints_ok = all(type(v) is int and v >= 0 for v in (info.start, info.count, info.bytes))
    if not (isinstance(info.file, str) and ints_ok and parse_checksum(info.checksum) is not None):
        return None
    return info


def check_same(dst: Path | str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse to resume when this conversion is not the one the journal describes."""
    why = None
    for key, b in new["options"].items():  # the options that decide the bytes (WriteOptions.identity)
        a = old.get("options", {}).get(key)
        if a != b:
            why = f"it used %({key}={a}), this run %({key}={b})"
            break
    if why is None and old.get("source") != new["source"]:
        a, b = old.get("source") or {}, new["source"]
        key = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "?")
        why = f"its source {key} was {a.get(key)!r}, now {b.get(key)!r}"
    if why is None and old.get("fingerprint") != new["fingerprint"]:
        why = "the source files changed since (sizes, modification times or contents)"
    if why is None and old.get("shards") != new["shards"]:
        why = "its shard plan differs"
    if why is not None:
        raise UsageError(
            f"{dst}: %(resume=True) refused: this is not the interrupted conversion ({why}); "
            "run it with the same source and options, or convert again with %(overwrite=True)"
        )


def remove(dst: Path, name: str = JOURNAL_NAME) -> None:
    (dst / name).unlink(missing_ok=True)
    (dst / f"{name}.tmp").unlink(missing_ok=True)
