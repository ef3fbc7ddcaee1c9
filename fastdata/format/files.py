"""The names a conversion writes into DST besides shards and manifest, and the source suffixes it reads:
defined once for the writers and for the reader's errors."""

from __future__ import annotations

import re

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

__all__ = ["ARRAY_SUFFIXES", "IMAGE_SUFFIXES", "JOURNAL_NAME", "LABEL_FILE_SUFFIXES", "LOCK_NAME", "OURS", "PART_FILE",
           "PART_JOURNAL", "PART_RECORD", "SKIPPED_NAME", "SOURCE_SUFFIXES", "TABLE_SUFFIXES", "TEMPORARY"]
