"""``fastdata merge A B ... DST``: one dataset holding the samples of A, then B, ... (docs/scale.md).
Shards are hard-linked (else copied); shards whose labels change (``remap_classes``) are rewritten."""

from __future__ import annotations

import errno
import io
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from fastdata._units import fmt_bytes
from fastdata._version import __version__
from fastdata.errors import UsageError
from fastdata.fileio import file_checksum, finish_file, fsync_dir
from fastdata.format import (
    FORMAT_VERSION,
    LABEL_FIELD,
    Manifest,
    ShardInfo,
    backend,
    read_manifest,
    shard_file_name,
    shard_path,
    write_manifest,
)
from fastdata.format.keys import DuplicateKeyError, write_keys
from fastdata.format.manifest import source_compression
from fastdata.format.spec import CHECKSUM_DEFAULT, version_for
from fastdata.format.store import LocalShards
from fastdata.write.destination import check_dst, prepare_dst, refuse_broken_url, remove_ours
from fastdata.write.engine import write_keys_file
from fastdata.write.shard_task import write_error

Method = Literal["auto", "link", "copy"]
# errno values meaning "this filesystem will not hard-link these files" (auto copies instead)
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOSYS}
_READ_ROWS = 256


@dataclass
class MergeReport:
    dst: Path
    inputs: int
    samples: int
    shards: int
    linked: int = 0
    copied: int = 0
    rewritten: int = 0
    bytes_written: int = 0
    copy_reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    keys: str = "none"  # sample keys of DST: "kept", "prefixed", "dropped" (drop_keys) or "none" (inputs had none)

    def summary(self) -> str:
        keys = {"kept": "sample keys kept", "prefixed": "sample keys kept under each input's prefix",
                "dropped": "sample keys dropped (--drop-keys)", "none": "no sample keys (the inputs have none)"}
        line = (f"merged {self.inputs} dataset(s) into {self.dst}: {self.samples} samples in {self.shards} shard(s); "
                f"{self.linked} hard-linked, {self.copied} copied, {self.rewritten} rewritten "
                f"({fmt_bytes(self.bytes_written)} written, {self.seconds:.1f} s); {keys[self.keys]}")
        if self.copy_reasons:
            line += f"; copied because hard links were refused: {self.copy_reasons[0]}"
        return line


def merge(inputs: list[str | os.PathLike[str]], dst: str | os.PathLike[str], *, remap_classes: bool = False,
          method: Method = "auto", overwrite: bool = False, progress: Any = None,
          key_prefixes: Sequence[str] | Literal["names"] | None = None, drop_keys: bool = False) -> MergeReport:
    """Write ``dst``: the samples of ``inputs`` in order, in one dataset; a key in two inputs is an error.

    ``key_prefixes``: one prefix per input (``""``: keys as they are), or ``"names"`` (each input's folder
    name); ``drop_keys``: DST gets no sample keys (needed when only some inputs have keys)."""
    t0 = time.perf_counter()
    if method not in ("auto", "link", "copy"):
        raise UsageError(f"unknown merge method {method!r} (auto, link or copy)")
    if isinstance(inputs, (str, bytes, os.PathLike)):  # else a path is taken for a list of one-letter folders
        raise UsageError(f"inputs is one path ({os.fsdecode(inputs)!r}); give a list of dataset folders, "
                         "e.g. merge([a, b], dst)")
    if not inputs:
        raise UsageError("merge needs at least one input dataset")
    for p in [*inputs, dst]:
        if "://" in str(p):
            raise UsageError(f"{p}: merge works on folders; object-storage URLs are not supported here")
    refuse_broken_url(dst)
    roots = [Path(p) for p in inputs]
    dst = Path(dst)
    manifests = [read_manifest(r) for r in roots]
    classes, maps = _reconcile(roots, manifests, remap_classes)
    prefixes = _key_prefixes(roots, key_prefixes, drop_keys)
    check_dst(dst, roots, overwrite)
    keys_mode, keys_bytes = _merged_keys(roots, manifests, prefixes, drop_keys, dst)  # collisions: before any work
    report = MergeReport(dst, len(roots), sum(m.num_samples for m in manifests), sum(len(m.shards) for m in manifests),
                         keys=keys_mode)
    if progress is not None:
        progress.start(report.samples, sum(s.bytes for m in manifests for s in m.shards), desc="merging")
    with prepare_dst(dst, roots, overwrite) as target:
        try:
            shards = _place_shards(roots, manifests, maps, target.path, method, report, progress)
            first = manifests[0]
            inputs_json: list[dict[str, Any]] = [{"path": os.path.abspath(r), "samples": m.num_samples,
                                                  "source": m.source} for r, m in zip(roots, manifests)]
            if prefixes is not None:
                for entry, p in zip(inputs_json, prefixes):
                    entry["key_prefix"] = p
            manifest = Manifest(
                backend=first.backend, fields=first.fields, num_samples=report.samples, shards=shards,
                classes=classes, version=max(FORMAT_VERSION, version_for(first.fields)),  # >= ORIGIN_VERSION: origins
                source={"kind": "merge", "fastdata_version": __version__, "inputs": inputs_json},
                keys=None if keys_bytes is None else write_keys_file(target.path, lambda f: f.write(keys_bytes)),
            )
            write_manifest(target.path, manifest)
        except BaseException:
            remove_ours(target.path)
            raise
    report.seconds = time.perf_counter() - t0
    return report


def _reconcile(roots: list[Path], ms: list[Manifest], remap: bool) -> tuple[list[str] | None, list[np.ndarray | None]]:
    """Refuse inputs that cannot be one dataset; the merged class list and, per input, its label
    map (None: labels stay as they are)."""
    a, first = roots[0], ms[0]
    for r, m in zip(roots, ms):
        if m.backend == "inplace":  # no shards to link or copy (fastdata/format/inplace.py)
            raise UsageError(f"{r}: is an in-place index: index the source files together (a glob), or convert them")
        if m.backend != first.backend:
            raise UsageError(f"{r}: is {m.backend} but {a} is {first.backend}: merge datasets of one format "
                             "(convert one again with %(backend))")
        _same_fields(a, first, r, m)
    lists = [m.classes for m in ms]
    if all(c is None for c in lists):
        return None, [None] * len(ms)
    if any(c is None for c in lists):
        r = roots[[c is None for c in lists].index(True)]
        named = roots[[c is not None for c in lists].index(True)]
        raise UsageError(f"{r}: has no class names but {named} has: cannot reconcile their labels")
    names = [c for c in lists if c is not None]  # every input has class names here
    if all(c == names[0] for c in names):
        return names[0], [None] * len(ms)
    if not remap:
        r, c = next((r, c) for r, c in zip(roots, names) if c != names[0])
        raise UsageError(f"{r}: classes differ from {a}'s: {_class_diff(names[0], c)}; pass %(remap_classes=True) to "
                         "rewrite labels to one class list (the first input's, then new names)")
    if not any(f.name == LABEL_FIELD for f in first.fields):
        raise UsageError(f"{a}: has classes but no {LABEL_FIELD!r} field to remap")
    merged: list[str] = list(names[0])
    for c in names[1:]:
        merged += [x for x in c if x not in merged]
    index = {x: i for i, x in enumerate(merged)}
    maps: list[np.ndarray | None] = []
    for c in names:
        lut = np.array([index[x] for x in c], dtype=np.int64)
        maps.append(None if np.array_equal(lut, np.arange(len(lut))) else lut)
    return merged, maps


def _key_prefixes(roots: list[Path], given: Sequence[str] | str | None, drop: bool) -> list[str] | None:
    """One key prefix per input (None: keys as they are), checked."""
    if given is None:
        return None
    if drop:
        raise UsageError("%(drop_keys=True) and a key prefix contradict each other: prefix keys to keep them, or drop them")
    if isinstance(given, str):
        if given != "names":
            raise UsageError(f"key_prefixes={given!r}: give one prefix per input (a list), or 'names'")
        prefixes = [Path(os.path.abspath(r)).name for r in roots]
        seen: dict[str, Path] = {}
        for r, p in zip(roots, prefixes):
            if p in seen:
                raise UsageError(f"{r} and {seen[p]} have the same folder name {p!r}, so %(key_prefixes='names') cannot tell "
                                 "their keys apart; pass %(key_prefixes) once per input instead")
            seen[p] = r
        return prefixes
    prefixes = list(given)
    if len(prefixes) != len(roots) or not all(isinstance(p, str) for p in prefixes):
        raise UsageError(f"{len(prefixes)} key prefix(es) for {len(roots)} input(s): give one per input, in order "
                         "('' keeps an input's keys as they are)")
    for p in prefixes:
        if p.startswith("/") or p.endswith("/") or "\0" in p:
            raise UsageError(f"key prefix {p!r}: no leading or trailing '/' (keys become '<prefix>/<key>')")
    return prefixes


def _input_keys(root: Path, m: Manifest) -> list[str]:
    """Every key of one input, in its sample order."""
    table = LocalShards(root, m).key_table()  # checked as a reader checks it
    if table is None:  # the keys are the indices
        return [str(i) for i in range(m.num_samples)]
    try:
        return table.all()
    finally:
        table.close()


def _merged_keys(roots: list[Path], ms: list[Manifest], prefixes: list[str] | None, drop: bool,
                 dst: Path) -> tuple[str, bytes | None]:
    """What DST's keys will be ("kept", "prefixed", "dropped", "none") and the keys file's bytes
    (None: no keys file). A key in two inputs is refused here, before anything is written."""
    if drop:
        return "dropped", None
    have = [m.keys is not None for m in ms]
    if not any(have):
        if prefixes is not None:
            raise UsageError(f"{roots[0]}: has no sample keys to prefix (written before format version 3)")
        return "none", None
    if not all(have):
        r, named = roots[have.index(False)], roots[have.index(True)]
        raise UsageError(f"{r}: has no sample keys (written before format version 3) but {named} has: DST could not "
                         f"keep them; convert {r} again to give it keys, or pass %(drop_keys=True) to merge without keys")
    keys: list[str] = []
    starts: list[int] = []
    for i, (r, m) in enumerate(zip(roots, ms)):
        starts.append(len(keys))
        own = _input_keys(r, m)
        p = prefixes[i] if prefixes is not None else ""
        keys += [f"{p}/{k}" for k in own] if p else own
    buf = io.BytesIO()
    try:
        write_keys(buf, keys, str(dst))
    except DuplicateKeyError as e:
        ia = max(i for i, s0 in enumerate(starts) if s0 <= e.a)
        ib = max(i for i, s0 in enumerate(starts) if s0 <= e.b)
        raise UsageError(f"sample key {e.key!r} is sample {e.a - starts[ia]} of {roots[ia]} and sample "
                         f"{e.b - starts[ib]} of {roots[ib]}: keys must stay unique in the merged dataset; pass "
                         "%(key_prefixes='names') (each input's keys under its folder name), %(key_prefixes) once per input, "
                         "or %(drop_keys=True)") from None
    return ("prefixed" if prefixes is not None and any(prefixes) else "kept"), buf.getvalue()


def _same_fields(a: Path, ma: Manifest, b: Path, mb: Manifest) -> None:
    fa, fb = {f.name: f for f in ma.fields}, {f.name: f for f in mb.fields}
    for name in fa:
        if name not in fb:
            raise UsageError(f"{b}: has no field {name!r}, which {a} has: merge datasets with the same fields")
    for name in fb:
        if name not in fa:
            raise UsageError(f"{b}: has a field {name!r}, which {a} has not: merge datasets with the same fields")
    for name, f in fa.items():
        g = fb[name]
        if f.to_json() != g.to_json():
            raise UsageError(f"{b}: field {name!r} is {_desc(g)}, in {a} {_desc(f)}: merge datasets with the same schema")
    if [f.name for f in ma.fields] != [f.name for f in mb.fields]:
        raise UsageError(f"{b}: lists its fields in another order than {a}")


def _desc(f: Any) -> str:
    shape = "(" + ", ".join("n" if d is None else str(d) for d in f.shape) + ")"
    return f"{f.np_dtype} {shape} {f.encoding}" + (f" {asdict(f.image)}" if f.image is not None else "")


def _class_diff(a: list[str], b: list[str]) -> str:
    extra = [x for x in b if x not in a]
    lack = [x for x in a if x not in b]
    parts = []
    if extra:
        parts.append(f"it has {', '.join(map(repr, extra[:5]))} (not in the first)")
    if lack:
        parts.append(f"it lacks {', '.join(map(repr, lack[:5]))}")
    if not parts:
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        parts.append(f"same names in another order (index {k}: {b[k]!r}, the first has {a[k]!r})")
    return "; ".join(parts)


def _place_shards(roots: list[Path], ms: list[Manifest], maps: list[np.ndarray | None], dst: Path, method: Method,
                  report: MergeReport, progress: Any) -> list[ShardInfo]:
    out: list[ShardInfo] = []
    offset = 0
    for root, m, label_map in zip(roots, ms, maps):
        for s in m.shards:
            name = shard_file_name(len(out), m.backend)
            start = offset + s.start
            src = shard_path(root, s)
            try:
                size = src.stat().st_size
            except FileNotFoundError:
                raise UsageError(f"{src}: shard missing (fastdata verify {root} lists what is wrong)") from None
            if size != s.bytes:
                raise UsageError(f"{src}: is {size} bytes, its manifest says {s.bytes} (fastdata verify {root})")
            if label_map is not None:
                info = _rewrite(src, s, m, label_map, dst, name, start)
                report.rewritten += 1
                report.bytes_written += info.bytes
            else:
                _link_or_copy(src, dst / name, method, report)
                origin = s.stored_start if s.stored_start != start else None
                info = ShardInfo(file=name, start=start, count=s.count, bytes=s.bytes, checksum=s.checksum, origin=origin)
            out.append(info)
            if progress is not None:
                progress.update(s.count, s.bytes)
        offset += m.num_samples
    fsync_dir(dst)
    return out


def _link_or_copy(src: Path, final: Path, method: Method, report: MergeReport) -> None:
    """Hard-link ``src`` to ``final``, else (or with ``method="copy"``) copy it; counted in ``report``."""
    if method != "copy":
        try:
            os.link(src, final)
            report.linked += 1
            return
        except OSError as e:
            if method == "link" or e.errno not in _NO_LINK:
                raise write_error(final, e) from None
            reason = f"{src} -> {final}: {e.strerror}"
            if reason not in report.copy_reasons:
                report.copy_reasons.append(reason)
    tmp = final.with_name(f".{final.name}.partial")
    try:
        shutil.copyfile(src, tmp)
        finish_file(tmp, final)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(final, e) from None
    report.copied += 1
    report.bytes_written += final.stat().st_size


def _rewrite(src: Path, s: ShardInfo, m: Manifest, label_map: np.ndarray, dst: Path, name: str,
             start: int) -> ShardInfo:
    """Copy shard ``s`` sample by sample with its labels mapped through ``label_map``; stored bytes
    (encoded images included) are copied as they are."""
    impl = backend(m.backend)
    reader = impl.ShardReader(src, s, m.fields)
    rows = {f.name: int(reader.lengths(f.name, np.arange(s.count)).sum()) for f in m.fields if f.ragged}
    tmp, final = dst / f".{name}.partial", dst / name
    try:
        with impl.ShardWriter(tmp, m.fields, s.count, rows, source_compression(m.source), start=start) as w:
            for a in range(0, s.count, _READ_ROWS):
                local = np.arange(a, min(a + _READ_ROWS, s.count))
                batch, lengths = _read(reader, m, local)
                for k in range(len(local)):
                    sample = {f.name: batch[f.name][k, : lengths[f.name][k]] if f.ragged else batch[f.name][k]
                              for f in m.fields}
                    old = int(sample[LABEL_FIELD])
                    if not 0 <= old < len(label_map):
                        raise UsageError(f"{src}: sample {s.start + a + k} has label {old}, outside its "
                                         f"{len(label_map)} classes: cannot remap it")
                    sample[LABEL_FIELD] = np.asarray(label_map[old], dtype=sample[LABEL_FIELD].dtype)
                    w.write(sample)
        checksum = file_checksum(tmp, CHECKSUM_DEFAULT)
        size = tmp.stat().st_size
        finish_file(tmp, final)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(final, e) from None
    finally:
        reader.close()
    return ShardInfo(file=name, start=start, count=s.count, bytes=size, checksum=checksum)


def _read(reader: Any, m: Manifest, local: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    n = len(local)
    outs: dict[str, np.ndarray] = {}
    lengths: dict[str, np.ndarray] = {}
    for f in m.fields:
        if f.ragged:
            lengths[f.name] = reader.lengths(f.name, local)
            longest = int(lengths[f.name].max()) if n else 0
            outs[f.name] = np.zeros((n, longest, *f.trailing), dtype=f.np_dtype)
        else:
            outs[f.name] = np.empty((n, *f.trailing), dtype=f.np_dtype)
    reader.read_into(local, np.arange(n), outs)
    return outs, lengths


__all__ = ["MergeReport", "merge"]
