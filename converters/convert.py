"""``fastdata.convert`` and ``fastdata.merge``, from Python or the CLI: every input is found and checked
by the source table before the write engine writes anything."""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping, Sequence

from fastdata.converters import DEFAULT_FIELD, ConvertConfig, Request, detect, src_form
from fastdata.converters.objects import is_python_source, python_source
from fastdata.errors import FastdataError, UsageError
from fastdata.remote import is_url
from fastdata.write import ConvertReport, Progress, Source, write_dataset
from fastdata.write.destination import RemoteTarget, check_dst, prepare_dst, refuse_broken_url
from fastdata.write.engine import check_source, import_ray
from fastdata.write.merge import merge

PathLike = str | os.PathLike[str]
__all__ = ["convert", "merge"]


def convert(src: PathLike | Any, dst: PathLike, config: ConvertConfig | None = None, *,
            labels: PathLike | None = None, arrays: Mapping[str, PathLike] | None = None,
            meta: PathLike | None = None, progress: Progress | None = None,
            fields: Sequence[str] | None = None, ragged: Sequence[str] = ()) -> ConvertReport:
    """Convert ``src`` into a dataset at ``dst`` and say what was written (samples, shards, bytes, skipped).

    ``src``: a folder of ``.npy``/``.npz`` files or images (labels from class folders, ``labels`` CSV/JSON,
    or none), a large ``.npy`` array (``labels`` then a ``.npy``), a metadata table (CSV, JSON Lines,
    Parquet), or Python samples (a map-style Dataset, an iterable, a Hugging Face dataset; tuples are named
    by ``fields``; ``ragged`` names fields whose first axis varies). ``arrays``: field -> ``.npy`` array.
    ``meta``: a metadata table of paths relative to ``src``. ``dst``: a folder or URL. ``config``: how
    (:class:`ConvertConfig`). Bad arguments raise ``UsageError`` (a ``ValueError``), bad input ``DataError``.
    """
    t0 = time.perf_counter()
    config = config if config is not None else ConvertConfig()
    if not isinstance(config, ConvertConfig):
        raise UsageError(f"%(config) must be a ConvertConfig, not {type(config).__name__}")
    python = _is_python(src, config, labels, arrays, meta, fields, ragged)
    url = dst if isinstance(dst, str) and is_url(dst) else None
    if url is None:
        refuse_broken_url(dst)
    if not python:
        if config.write.engine == "ray":
            import_ray()  # before anything is scanned or written: a missing extra is a one-line error
        for p in (src, labels, meta, *(arrays or {}).values()):
            if p is not None and is_url(str(p)):
                raise UsageError(f"{p}: sources must be local files or folders (download it first); only the "
                                 "destination may be a URL")
    upload = None  # a URL destination, checked before anything is scanned (a refusal costs nothing)
    if url is not None:
        upload = RemoteTarget(url, config.remote, part=config.part)
        upload.check(config.overwrite, config.resume)
    elif config.remote is not None:
        raise UsageError(f"{dst}: %(remote) options apply to URL destinations only, and this is a local path")
    req = None if python else _request(src, labels, arrays, meta, config)
    inputs = req.inputs if req is not None else []
    target = upload.staging if upload is not None else Path(dst)
    if upload is None:  # before scanning; a part checks only the sources (DST is shared with other parts)
        check_dst(target, inputs, config.overwrite or config.part is not None, config.resume and config.part is None)
    if req is None:
        scanned: Any = python_source(src, config, progress, fields, ragged, target)
    else:
        scanned = nullcontext(detect(req).scan(req, config, progress))
    with scanned as source:  # the reader's limits are checked before anything is written
        check_source(source, config.write, type(src).__name__ if req is None else
                     str(req.meta or req.src or next(iter(req.arrays.values()))))
        report = _write(source, target, upload, inputs, config, progress)
    report.seconds = time.perf_counter() - t0  # the whole conversion: checking the sources too
    return report


def _is_python(src: Any, config: ConvertConfig, labels: PathLike | None, arrays: Mapping[str, PathLike] | None,
               meta: PathLike | None, fields: Sequence[str] | None, ragged: Sequence[str]) -> bool:
    """Whether ``src`` is Python samples (fastdata/converters/objects.py) rather than paths; the
    arguments that apply only to the other kind are refused."""
    if not is_python_source(src):
        if fields is not None or ragged:
            raise UsageError("%(fields) and %(ragged) apply to Python sources (a Dataset, an iterable), not to paths")
        return False
    if labels is not None or arrays or meta is not None:
        raise UsageError("%(labels), %(arrays) and %(meta) apply to file sources; with Python samples, put "
                         "those values in each sample")
    if config.write.engine == "ray":
        raise UsageError("Python objects are converted with %(engine=local): Ray workers on other machines cannot "
                         "reach the object (convert to files first, or use the local engine)")
    return True


def _request(src: PathLike | None, labels: PathLike | None, arrays: Mapping[str, PathLike] | None,
             meta: PathLike | None, config: ConvertConfig) -> Request:
    """The inputs as a :class:`Request`, their combination checked (each kind checks its own options)."""
    label_path = Path(labels) if labels is not None else None
    if label_path is not None and config.no_labels:
        raise UsageError("%(labels) and %(no_labels) contradict each other")
    if label_path is not None and not label_path.is_file():
        raise UsageError(f"{label_path}: labels file not found")
    if config.labels_columns is not None and (label_path is None or label_path.suffix.lower() == ".npy"):
        raise UsageError("%(labels_columns) names the columns of a labels CSV or JSON file (%(labels=FILE))")
    named = {k: Path(v) for k, v in (arrays or {}).items()}
    src_path = Path(src) if src is not None else None
    form = src_form(src_path) if src_path is not None else None  # the source table says what SRC is
    table_src = form == "table"
    if meta is not None or table_src:
        return _table_request(src_path, Path(meta) if meta is not None else None, table_src, named, label_path)
    if config.meta_types:
        raise UsageError("%(meta_types) applies to a metadata table (%(meta=TABLE), or a table as %(src))")
    if config.keypoints or config.boxes or config.not_coordinates:
        raise UsageError("%(keypoints), %(boxes) and %(not_coordinates) name columns of a metadata table "
                         "(%(meta=TABLE), or a table as %(src))")
    if src_path is None:
        if not named:
            raise UsageError("nothing to convert: give %(src), or %(arrays)")
        return Request(None, named, label_path)
    if form == "arrays":  # an HDF5 file (or glob of them), a Zarr store: fields name arrays inside it
        if label_path is not None:
            raise UsageError(f"{src_path}: %(labels) does not apply here: name the labels' array as a field "
                             "(label=/labels)")
        return Request(src_path, {}, None, in_file={k: os.fspath(v) for k, v in (arrays or {}).items()})
    if not os.path.exists(src_path):
        raise UsageError(f"{src_path}: no such file or folder")
    if src_path.is_file():
        if src_path.suffix.lower() != ".npy":
            raise UsageError(f"{src_path}: a single-file source must be a .npy array, an HDF5 file or a table "
                             "(.csv, .tsv, .jsonl, .parquet), or give a folder (or a Zarr store)")
        if DEFAULT_FIELD in named:
            raise UsageError(f"{src_path}: given both as %(src) and as field {DEFAULT_FIELD!r} of %(arrays)")
        return Request(None, {DEFAULT_FIELD: src_path, **named}, label_path)
    if named:
        raise UsageError("give either a source folder or %(arrays), not both")
    return Request(src_path, {}, label_path)


def _table_request(src: Path | None, meta: Path | None, table_src: bool, named: dict[str, Path],
                   labels: Path | None) -> Request:
    """A metadata table: ``meta`` with the folder ``src``, or ``src`` itself a table (paths relative to it)."""
    if table_src:
        assert src is not None
        if meta is not None:
            raise UsageError(f"{src}: a table given as %(src) is the metadata itself; drop %(meta)")
        meta, root = src, src.parent
    else:
        assert meta is not None
        if named or src is None:
            raise UsageError("%(meta=TABLE) needs a source folder %(src) (the table's paths are relative to it)")
        root = src
    if labels is not None:
        raise UsageError("%(labels) does not apply with a metadata table: its columns are the fields (add a "
                         "'label' column for the labels)")
    if not root.is_dir():
        raise UsageError(f"{root}: no such folder")
    return Request(root, {}, None, meta, table_src)


def _write(source: Source, dst: Path, upload: RemoteTarget | None, inputs: list[Path], config: ConvertConfig,
           progress: Progress | None) -> ConvertReport:
    """Write the scanned ``source`` into the folder ``dst`` (the whole dataset or one part), or to a URL
    through its staging folder (the shard tasks upload their shards; ``upload`` the rest)."""
    trusted = upload.prepare(config.overwrite, config.resume) if upload is not None else set()
    overwrite = config.overwrite and upload is None  # a URL's staging folder starts empty
    prepared = prepare_dst(dst, inputs, overwrite, config.resume, config.part)
    if upload is None:
        with prepared as target:
            return write_dataset(source, target, config.write, progress)
    try:
        with prepared as target:
            target.on_shard = upload.shard_done
            target.trusted = trusted
            target.remote = upload.spec  # each shard task uploads the shard it writes
            target.on_start = upload.upload_journal
            report = write_dataset(source, target, config.write, progress)
        upload.finish()
    except BaseException as e:
        upload.abandon()
        done = len(upload.uploaded)
        if isinstance(e, FastdataError) and not isinstance(e, UsageError) and upload.journal_uploaded:
            what = (f"{done} finished shard(s) are uploaded to {upload.url}" if done
                    else f"its journal is at {upload.url}")
            raise type(e)(f"{(e.template or str(e)).split('; ')[0]}; {what}: fix the problem, then run the same command with "
                          "%(resume=True) to finish") from None
        raise
    report.dst = upload.url
    return report
