"""``fastdata verify``: each shard's size and checksum against the manifest, and with ``deep`` every sample read
and checked against the schema; problems are returned, never raised, so one run names them all."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import FastdataError
from fastdata.fileio import file_checksum, not_regular
from fastdata.format import (
    IMAGE_ENCODINGS,
    LABEL_FIELD,
    FieldSpec,
    Manifest,
    ShardInfo,
    backend,
    read_manifest,
    shard_path,
)
from fastdata.format.spec import SHAPE_SUFFIX
from fastdata.reading.dataset import Dataset
from fastdata.remote import RemoteOptions, is_url
from fastdata.world import usable_cpus
from fastdata.write.options import Progress

_BATCH_BYTES = 32 << 20
_MAX_BATCH = 1024
MAX_SAMPLE_PROBLEMS = 20  # per shard; more are counted, not listed


@dataclass(frozen=True)
class Problem:
    """One thing wrong: with a shard file name, a sample index (global), or neither. ``unreadable``: the
    shard fails its reader's checks at open, so ``deep`` does not read its samples (each read would fail alike)."""

    message: str
    shard: str | None = None
    sample: int | None = None
    unreadable: bool = False

    def __str__(self) -> str:
        return self.message


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``ok`` when there is no problem."""

    root: Path | str
    shards: int
    samples: int
    deep: bool
    samples_read: int = 0
    problems: list[Problem] = field(default_factory=list)
    checked: str = ""  # what was checked, where not the shards' size and checksum (an in-place index's files)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_shards(self) -> list[str]:
        return sorted({p.shard for p in self.problems if p.shard is not None})

    def summary(self) -> str:
        what = self.checked or f"{self.shards} shard(s) checked (size and checksum)"
        if self.deep:
            what += f", {self.samples_read} of {self.samples} samples read and decoded"
        if self.ok:
            return f"{self.root}: OK: {what}"
        return f"{self.root}: {len(self.problems)} problem(s) in {len(self.bad_shards)} shard(s): {what}"


def verify(root: str | os.PathLike[str], deep: bool = False, progress: Progress | None = None,
           remote: RemoteOptions | None = None) -> VerifyReport:
    """Check the dataset at ``root`` (a URL: each shard's copy in the shard cache); raises only when its
    manifest itself is missing or invalid."""
    ds = Dataset(root, remote=remote) if isinstance(root, str) and is_url(root) else None
    where = str(root) if ds is not None else Path(root)
    manifest = ds.manifest if ds is not None else read_manifest(Path(root))
    report = VerifyReport(where, len(manifest.shards), manifest.num_samples, deep)
    if ds is not None:
        report.problems += _check_remote(ds, progress)
    elif manifest.backend == "inplace":  # an in-place index: its source files, not shards (fastdata/write/inplace.py)
        from fastdata.format.external import file_problems
        from fastdata.format.inplace import index_of

        index = index_of(manifest, str(root))
        report.problems += [Problem(p) for p in file_problems(index, deep)]
        report.checked = (f"{len(index.files)} source file(s) checked (stamp, metadata and sampled blocks"
                          + (", and the full checksums recorded with --checksum)" if deep else ")"))
    else:
        report.problems += check_shards(Path(root), manifest, progress)
    keys = manifest.keys
    if ds is None and keys is not None and keys.file is not None:  # the sample keys' side file: size and checksum too
        report.problems += _check_shard(Path(root), ShardInfo(file=keys.file, start=0, count=manifest.num_samples,
                                                              bytes=keys.bytes, checksum=str(keys.checksum)))
    if deep:
        skip = {p.shard for p in report.problems if p.unreadable and p.shard is not None}
        report.samples_read, problems = check_samples(Path(root), manifest, progress, ds=ds, skip=skip)
        report.problems += problems
    return report


def _check_remote(ds: Dataset, progress: Progress | None) -> list[Problem]:
    """Each shard, then the keys file, of a remote dataset downloaded into the cache and checked there."""
    store, manifest = ds.remote, ds.manifest
    assert store is not None
    if progress is not None:
        progress.start(manifest.num_samples, sum(s.bytes for s in manifest.shards), desc="download + checksums")
    problems: list[Problem] = []
    for i, info in enumerate(manifest.shards):
        problems += _check_cached(partial(store.fetch, i), partial(store.local_path, i), info.file,
                                  info.checksum, info.checksum_algorithm)
        if progress is not None:
            progress.update(info.count, info.bytes)
    if store.keys is not None:  # the sample keys' side file
        k = store.keys
        problems += _check_cached(store.fetch_keys, store.keys_path, str(k.file), str(k.checksum),
                                  str(k.checksum).partition(":")[0])
    return problems


def _check_cached(fetch: Callable[[], Any], path: Callable[[], Path], file: str, checksum: str,
                  algorithm: str) -> list[Problem]:
    """A remote file downloaded into the cache (checked on the way in), then its cached copy hashed."""
    try:
        fetch()
        where = path()
        digest = file_checksum(where, algorithm)
    except FileNotFoundError:  # evicted right after the download by another process: checked on the way in
        return []
    except FastdataError as e:
        return [Problem(str(e), shard=file)]
    if digest == checksum:
        return []
    return [Problem(f"{file}: the cached copy {where} has checksum {digest}, the manifest says {checksum} "
                    "(changed on the local disk)", file)]


def check_shards(root: Path, manifest: Manifest, progress: Progress | None = None) -> list[Problem]:
    """Each shard's existence, size, checksum and open checks against the manifest, on a few threads."""
    if progress is not None:
        progress.start(manifest.num_samples, sum(s.bytes for s in manifest.shards), desc="checksums")
    workers = max(1, min(usable_cpus(), 8, len(manifest.shards) or 1))
    problems: list[Problem] = []
    with ThreadPoolExecutor(workers, thread_name_prefix="fastdata-verify") as pool:
        for info, found in zip(manifest.shards, pool.map(lambda s: _check_shard(root, s, manifest), manifest.shards)):
            problems += found
            if progress is not None:
                progress.update(info.count, info.bytes)
    return problems


def _check_shard(root: Path, info: ShardInfo, manifest: Manifest | None = None) -> list[Problem]:
    """What is wrong with one shard file (or, without ``manifest``, the keys file): existence, size, checksum,
    then the reader's checks at open against the manifest (a count edited in it, which no checksum covers)."""
    where = info.file
    try:
        path = shard_path(root, info)
        st = path.stat()
        if why := not_regular(st.st_mode):
            return [Problem(f"{where}: {why}", where)]
        if st.st_size != info.bytes:
            return [Problem(f"{where}: file is {st.st_size} bytes, the manifest says {info.bytes} (truncated or replaced)", where)]
        digest = file_checksum(path, info.checksum_algorithm)
    except FileNotFoundError:
        return [Problem(f"{where}: file is missing", where)]
    except FastdataError as e:
        return [Problem(str(e), where)]
    except OSError as e:
        return [Problem(f"{where}: cannot read: {e.strerror or e}", where)]
    corrupt = None
    if digest != info.checksum:
        corrupt = f"{where}: checksum is {digest}, the manifest says {info.checksum} (corrupted since it was written)"
    if manifest is not None:
        reader = backend(manifest.backend).ShardReader(path, info, manifest.fields)
        try:
            reader.handle()
        except FastdataError as e:  # one problem per shard: the checksum's, if it failed too
            return [Problem(corrupt or str(e), where, unreadable=True)]
        finally:
            reader.close()
    return [Problem(corrupt, where)] if corrupt else []


def check_samples(root: Path, manifest: Manifest, progress: Progress | None = None,
                  ds: Dataset | None = None, skip: set[str] | frozenset[str] = frozenset()) -> tuple[int, list[Problem]]:
    """Read every sample (but those of the shards in ``skip``, found unreadable) and check it against the
    schema; the samples read and the problems (one, if the dataset cannot be opened)."""
    try:
        ds = ds or Dataset(root)
    except FastdataError as e:
        return 0, [Problem(f"samples not read: the dataset cannot be opened: {e}")]
    if progress is not None:
        progress.start(manifest.num_samples, 0, desc="reading samples")
    batch = _batch_size(manifest.fields)
    problems: list[Problem] = []
    read = 0
    with ds:
        for info in manifest.shards:
            if info.file in skip:
                continue
            found: list[Problem] = []
            for a in range(info.start, info.start + info.count, batch):
                idx = np.arange(a, min(a + batch, info.start + info.count))
                found += _check_batch(ds, manifest, info, idx)
                read += len(idx)
                if progress is not None:
                    progress.update(len(idx), 0)
            if len(found) > MAX_SAMPLE_PROBLEMS:
                more = len(found) - MAX_SAMPLE_PROBLEMS
                found = found[:MAX_SAMPLE_PROBLEMS] + [Problem(f"shard {info.file}: {more} more bad sample(s)", info.file)]
            problems += found
    return read, problems


def _batch_size(fields: list[FieldSpec]) -> int:
    fixed = sum(f.row_nbytes for f in fields if not f.ragged)
    return int(max(1, min(_MAX_BATCH, _BATCH_BYTES // max(1, fixed), 64 if any(f.ragged for f in fields) else _MAX_BATCH)))


def _check_batch(ds: Dataset, m: Manifest, info: ShardInfo, idx: np.ndarray) -> list[Problem]:
    """Problems in the samples ``idx`` of one shard; a failing batch is re-read sample by sample."""
    try:
        return _check_values(ds.get_batch(idx), m, info, idx)
    except Exception as e:  # noqa: BLE001 - verification reports every failure, typed or not
        if len(idx) == 1:
            said = str(e) if isinstance(e, FastdataError) else f"unexpected {type(e).__name__}: {e}"
            return [Problem(said, info.file, int(idx[0]))]
    return [p for i in idx for p in _check_batch(ds, m, info, np.array([i]))]


def _check_values(batch: dict[str, Any], m: Manifest, info: ShardInfo, idx: np.ndarray) -> list[Problem]:
    """What the reader's own checks leave open: an image's recorded size of 0, a label outside the class list.
    (get_batch makes each field's array from the schema and checks the image shapes it records, so dtypes and
    shapes hold by construction; what it cannot read raises, and :func:`_check_batch` reports it.)"""
    out: list[Problem] = []
    for f in m.fields:
        if f.encoding not in IMAGE_ENCODINGS:
            continue
        a = batch[f.name]
        for k, (h, w, ch) in enumerate(batch[f.name + SHAPE_SUFFIX].tolist()):
            if not (h > 0 and w > 0):
                out.append(_sample_problem(info, idx, k, f"image field {f.name!r} records shape {(h, w, ch)}, "
                                                         f"inconsistent with its decoded batch {a.shape[1:]}"))
    labels = batch.get(LABEL_FIELD)
    if m.classes is not None and labels is not None and labels.shape == (len(idx),):
        wrong = np.flatnonzero((labels < 0) | (labels >= len(m.classes)))
        for k in wrong[:MAX_SAMPLE_PROBLEMS]:
            out.append(_sample_problem(info, idx, int(k), f"label {int(labels[k])} is not a class index "
                                                          f"(there are {len(m.classes)} classes)"))
    return out


def _sample_problem(info: ShardInfo, idx: np.ndarray, k: int, msg: str) -> Problem:
    sample = int(idx[k])
    return Problem(f"shard {info.file}, sample {sample}: {msg}", info.file, sample)
