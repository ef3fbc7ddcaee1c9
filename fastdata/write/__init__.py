"""The write engine: a scanned Source -> shards + manifest, crash-safe and resumable, locally, on Ray,
part by part or to a URL; and merging datasets (the sources live in fastdata.converters)."""

from __future__ import annotations

from fastdata.write.engine import plan_shards, write_dataset
from fastdata.write.merge import MergeReport, merge
from fastdata.write.options import DEFAULT_SHARD_SIZE, ConvertReport, Progress, Source, WriteOptions
from fastdata.write.parts import MergePartsReport, merge_parts, parse_part

__all__ = ["ConvertReport", "DEFAULT_SHARD_SIZE", "MergePartsReport", "MergeReport", "Progress", "Source",
           "WriteOptions", "merge", "merge_parts", "parse_part", "plan_shards", "write_dataset"]
