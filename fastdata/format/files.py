"""The names a conversion writes into DST besides shards and manifest, and the source suffixes it reads:
defined once for the writers and for the reader's errors, which tell from them what a folder without
``manifest.json`` is, so that the error names the fix that works (``--resume``, ``merge-parts`` or convert)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastdata.errors import FormatError, IncompleteDatasetError
from fastdata.format.spec import MANIFEST_NAME

JOURNAL_NAME = ".fastdata-journal"  # an unfinished conversion: what --resume continues
LOCK_NAME = ".fastdata.lock"  # held by the conversion writing DST
SKIPPED_NAME = "skipped.json"  # the bad samples --skip-bad skipped
_PART = r"part-\d{5,}-of-\d{5,}"
# Every name a conversion may leave in DST; --overwrite deletes only these.
OURS = re.compile(
    r"^(manifest\.json|skipped\.json|keys\.bin|\.keys\.bin\..+\.tmp|\.manifest\..+\.tmp"
    r"|\.?shard-\d{5,}\.(h5|lmdb)(\.partial)?(-lock)?"
    rf"|\.fastdata-journal(-{_PART})?(\.tmp)?|\.fastdata\.lock|\.fastdata-{_PART}\.(json|lock)"
    rf"|\.\.fastdata-{_PART}\.json\..+\.tmp)$"
)
# Temporary names: never part of a finished or resumable conversion.
TEMPORARY = re.compile(
    r"^(\.manifest\..+\.tmp|\.keys\.bin\..+\.tmp|\.shard-\d{5,}\.(h5|lmdb)\.partial(-lock)?|shard-\d{5,}\.lmdb-lock"
    r"|\.fastdata-journal\.tmp)$"
)
# The files of one part of a conversion split with --part I/N: record (.json), journal, lock.
PART_FILE = re.compile(r"^\.fastdata-(?:journal-)?part-(\d{5,})-of-(\d{5,})(?:\.json|\.lock)?$")
PART_RECORD = re.compile(rf"^\.fastdata-{_PART}\.json$")
PART_JOURNAL = re.compile(rf"^\.fastdata-journal-{_PART}$")

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif"})
ARRAY_SUFFIXES = (".npy", ".npz")
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".json": "json"}
LABEL_FILE_SUFFIXES = (".csv", ".json")
# What a source folder holds (samples, tables, label files): a folder of these is no dataset yet.
SOURCE_SUFFIXES = tuple(sorted(set(ARRAY_SUFFIXES) | set(TABLE_SUFFIXES) | set(LABEL_FILE_SUFFIXES) | IMAGE_SUFFIXES))

_LOOK = 2000  # names looked at in sub-folders, at most: enough to tell, cheap on a huge folder


def not_a_folder_error(root: Path) -> FormatError:
    """The error for a dataset path that is no folder: missing, a source file, or some other file."""
    if not os.path.lexists(root):
        return FormatError(f"{root}: no such folder (a fastdata dataset is the folder fastdata convert wrote)")
    if root.name.lower().endswith(SOURCE_SUFFIXES):
        return FormatError(f"{root}: a source file, not a fastdata dataset (a dataset is a folder); convert it with "
                           f"`fastdata convert {root} DST`, then open DST")
    return FormatError(f"{root}: not a directory (a fastdata dataset is a directory)")


def no_manifest_error(root: Path | str, names: set[str] | None = None) -> FormatError:
    """The error for the folder ``root`` (or a URL whose ``names`` are listed), which has no manifest: what
    the folder is, and what to do."""
    names = set(os.listdir(root)) if names is None else names
    if JOURNAL_NAME in names:
        return IncompleteDatasetError(
            f"{root}: incomplete dataset: no {MANIFEST_NAME} (the conversion did not finish: run the same "
            "fastdata convert command with --resume to finish it, or with --overwrite to start over)")
    if any(PART_RECORD.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: parts of a conversion split with --part I/N, not merged yet (no {MANIFEST_NAME}): once every "
            f"part is done, run fastdata merge-parts {root}")
    if any(PART_JOURNAL.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: an unfinished part of a conversion split with --part I/N (no {MANIFEST_NAME}): finish each "
            f"part with its fastdata convert command plus --resume, then run fastdata merge-parts {root}")
    if any(OURS.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: incomplete dataset: a conversion started here but left no {MANIFEST_NAME} and no journal to "
            "resume from; convert again with --overwrite")
    if not names:
        return FormatError(f"{root}: an empty folder, not a fastdata dataset (no {MANIFEST_NAME})")
    if _holds_source_files(root, names):
        return FormatError(f"{root}: this is a source folder, not a fastdata dataset (no {MANIFEST_NAME}); convert "
                           f"it with `fastdata convert {root} DST`, then open DST")
    return FormatError(f"{root}: not a fastdata dataset (no {MANIFEST_NAME}); a dataset is the folder that "
                       "fastdata convert wrote")


def _holds_source_files(root: Path | str, names: set[str]) -> bool:
    """Whether ``root`` or one of its sub-folders (class folders; not of a URL) holds .npy, image or table files."""
    if any(n.lower().endswith(SOURCE_SUFFIXES) for n in names):
        return True
    if not isinstance(root, Path):  # a URL: its sub-folders are not looked into
        return False
    looked = 0
    for n in sorted(names):
        try:
            with os.scandir(root / n) as it:
                for e in it:
                    looked += 1
                    if e.name.lower().endswith(SOURCE_SUFFIXES):
                        return True
                    if looked >= _LOOK:
                        return False
        except OSError:  # a file, or a folder we may not read
            continue
    return False


__all__ = ["ARRAY_SUFFIXES", "IMAGE_SUFFIXES", "JOURNAL_NAME", "LABEL_FILE_SUFFIXES", "LOCK_NAME", "OURS", "PART_FILE",
           "PART_JOURNAL", "PART_RECORD", "SKIPPED_NAME", "SOURCE_SUFFIXES", "TABLE_SUFFIXES", "TEMPORARY",
           "no_manifest_error", "not_a_folder_error"]
