"""Python objects as sources: a map-style Dataset or a Hugging Face dataset (or ``pyarrow.Table``: its rows read in
batches, numeric and fixed-shape columns as one numpy array per batch), read in the write engine's workers; an
iterable, read once into a spool file beside the destination. ``fastdata.convert`` calls :func:`python_source`."""

from __future__ import annotations

import bisect
import fcntl
import itertools
import os
import pickle
import random
import shutil
import sys
import tempfile
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from fastdata.converters.config import ConvertConfig
from fastdata.converters.sample_fields import SampleSchema, infer_schema
from fastdata.converters.scan import map_tasks
from fastdata.errors import DataError, FastdataError, UsageError
from fastdata.format import FieldSpec
from fastdata.handles import PerProcessHandle
from fastdata.world import usable_cpus
from fastdata.write import Progress, Source
from fastdata.write.engine import mp_context

BATCH_ROWS = 1024  # rows of an Arrow batch, and of a task of the check pass
_SPOOL_PREFIX = ".fastdata-spool-"  # the hidden folder beside DST that an iterable is read into once


def is_arrow(obj: Any) -> bool:
    """A Hugging Face ``datasets.Dataset`` (read through its Arrow table) or a ``pyarrow.Table``."""
    top = type(obj).__module__.split(".")[0]
    return (top == "datasets" and hasattr(obj, "with_format")) or (top == "pyarrow" and hasattr(obj, "slice")
                                                                  and hasattr(obj, "column_names"))


class ArrowRows:
    """Row ``j`` of ``obj`` as {column: value}, from a cached batch of :data:`BATCH_ROWS` rows (each Arrow
    chunk of the batch converted on its own: nothing is copied to join chunks)."""

    def __init__(self, obj: Any) -> None:
        self._plain = type(obj).__module__.split(".")[0] == "pyarrow"
        self._table = obj if self._plain else obj.with_format("arrow")
        self._len = obj.num_rows if self._plain else len(obj)
        self._start = -1
        self._n = 0
        self._cols: dict[str, tuple[list[int], list[Any]]] = {}  # column -> (chunk starts, chunk values)

    def row(self, j: int) -> dict[str, Any]:
        return {name: values[k] for name, values, k in self._at(j)}

    def rows(self, j: int, n: int) -> dict[str, np.ndarray] | None:
        """Rows ``j`` to at most ``j + n - 1`` (at least one) as {column: numpy array of rows}, views of the batch;
        None when a column's values are not one numpy array (strings, images, ragged lists, missing values)."""
        out = {}
        for name, values, k in self._at(j):
            if not isinstance(values, np.ndarray):
                return None
            out[name] = values[k:]
            n = min(n, len(out[name]))
        return {name: v[:n] for name, v in out.items()}

    def _at(self, j: int) -> list[tuple[str, Any, int]]:
        """Per column: (name, the values of the chunk holding row ``j``, the row's place in them); loads its batch."""
        if not self._start <= j < self._start + self._n:
            self._load(j - j % BATCH_ROWS)
        k = j - self._start
        out = []
        for name, (starts, chunks) in self._cols.items():
            c = bisect.bisect_right(starts, k) - 1 if len(starts) > 1 else 0  # most batches: one chunk per column
            out.append((name, chunks[c], k - starts[c]))
        return out

    def _load(self, start: int) -> None:
        stop = min(start + BATCH_ROWS, self._len)
        batch = self._table.slice(start, stop - start) if self._plain else self._table[start:stop]
        self._cols = {}
        for name in batch.column_names:
            chunks = [c for c in batch.column(name).chunks if len(c)]
            starts = np.cumsum([0] + [len(c) for c in chunks[:-1]]).tolist()
            self._cols[name] = (starts, [column_values(c, name) for c in chunks])
        self._start, self._n = start, stop - start


def column_values(col: Any, name: str) -> Any:
    """One Arrow array (a chunk of a column) as a numpy array of rows (numbers, fixed-shape arrays) or a list of values."""
    import pyarrow as pa

    arr = col
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage  # e.g. datasets' Array2D..Array5D: nested lists underneath
    if arr.null_count:
        return arr.to_pylist()  # a missing value (None) is then refused, or skipped, for its own sample
    fixed = _fixed_numpy(arr)
    if fixed is not None:
        return fixed
    t = arr.type
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:  # datasets' Image() feature: {bytes, path}
        return [_image_bytes(r, name) for r in arr.to_pylist()]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _fixed_numpy(arr.flatten())
        if inner is not None:  # ragged rows of numbers: views into one array
            offs = np.asarray(arr.offsets)
            offs = offs - offs[0]
            return [inner[a:b] for a, b in zip(offs[:-1].tolist(), offs[1:].tolist())]
    return arr.to_pylist()


def _fixed_numpy(arr: Any) -> np.ndarray | None:
    """Numbers or nested lists of one length per level, as one array (rows first); None otherwise."""
    import pyarrow as pa

    dims: list[int] = []
    t = arr.type
    while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        n = len(arr)
        if pa.types.is_fixed_size_list(t):
            size = t.list_size
            arr = arr.flatten()
        else:
            offs = np.asarray(arr.offsets)
            sizes = np.diff(offs)
            if n and (sizes != sizes[0]).any() or arr.null_count:
                return None
            size = int(sizes[0]) if n else 0
            arr = arr.flatten()
        dims.append(size)
        t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return None
    base = arr.to_numpy(zero_copy_only=False)
    rows = len(base) // max(1, int(np.prod(dims))) if dims else len(base)
    return base.reshape(rows, *dims)


def _image_bytes(r: dict[str, Any], name: str) -> bytes:
    if r.get("bytes") is not None:
        return bytes(r["bytes"])
    path = r.get("path")
    if not path:
        raise DataError(f"column {name!r}: an image with neither bytes nor a path")
    return Path(path).read_bytes()


PROBE_SAMPLES = 16  # the schema comes from this many first samples
_LIVE: dict[str, Any] = {}  # token -> the object being converted, in this process (forked workers inherit it)


def is_python_source(obj: Any) -> bool:
    """Whether ``fastdata.convert`` reads ``obj`` as Python samples rather than as a path."""
    return obj is not None and not isinstance(obj, (str, bytes, os.PathLike))


@dataclass(frozen=True)
class ObjectRef:
    """The object being converted, reachable from any worker: inherited (fork), else unpickled once per
    process from ``pickled``."""

    token: str
    pickled: str | None = None

    def get(self) -> Any:
        obj = _LIVE.get(self.token)
        if obj is None:
            if self.pickled is None:
                raise FastdataError("the object being converted is not in this worker process")
            with open(self.pickled, "rb") as f:
                obj = _LIVE[self.token] = pickle.load(f)
        return obj


@contextmanager
def live(obj: Any, workers: int) -> Iterator[ObjectRef]:
    """Make ``obj`` reachable from the conversion's workers while the context lasts."""
    token = uuid.uuid4().hex
    _LIVE[token] = obj
    tmp = None
    try:
        if workers > 1 and mp_context().get_start_method() != "fork":
            tmp = tempfile.mkdtemp(prefix="fastdata-object-")  # private (0700): the workers unpickle from here
            path = os.path.join(tmp, "object.pkl")
            try:
                with open(path, "wb") as f:
                    pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                raise UsageError(f"{type(obj).__name__}: cannot be pickled for the worker processes ({e}); make it "
                                 "picklable (open files lazily in __getitem__) or use %(workers=1)") from None
            yield ObjectRef(token, path)
        else:
            yield ObjectRef(token)
    finally:
        _LIVE.pop(token, None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(eq=False)
class ObjectSource:
    """A map-style object (or an Arrow-backed dataset) as the write engine's Source. ``index``: the samples kept
    (skip_bad), None for all; ``ragged_rows`` is None (ragged rows are learnt by reading)."""

    ref: ObjectRef
    schema: SampleSchema
    count: int
    nbytes_est: int  # per sample: exact when every field is fixed, the first samples' mean otherwise
    type_name: str
    arrow: bool
    index: np.ndarray | None = None
    offset: int = 0
    keys: list[str] | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kind: str = "python"
    classes: list[str] | None = None
    fields: list[FieldSpec] = field(init=False)

    def __post_init__(self) -> None:
        self.fields = self.schema.fields
        self._rows: ArrowRows | None = None
        self._cache: list[dict[str, np.ndarray] | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_rows", "_cache", "keys")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _rows=None, _cache=None, keys=None)

    def __len__(self) -> int:
        return self.count

    @property
    def bytes_in(self) -> int:
        return self.nbytes_est * self.count

    def sample_nbytes(self) -> np.ndarray:
        return np.full(self.count, self.nbytes_est, dtype=np.int64)

    def ragged_rows(self, name: str) -> np.ndarray | None:
        return None  # known once read: the worker calls load_rows()

    def sample_keys(self) -> list[str] | None:
        return self.keys

    def part(self, start: int, stop: int) -> "ObjectSource":
        if self.index is not None:
            return replace(self, index=self.index[start:stop], count=stop - start, keys=None)
        return replace(self, offset=self.offset + start, count=stop - start, keys=None)

    def get(self, j: int) -> Any:
        """The object's sample ``j``; its own errors become a DataError naming the index."""
        if self.arrow:
            if self._rows is None:
                self._rows = ArrowRows(self.ref.get())
            return self._rows.row(j)
        try:
            return self.ref.get()[j]
        except FastdataError:
            raise
        except Exception as e:
            raise DataError(f"sample {j}: {self.type_name}[{j}] raised {type(e).__name__}: {e}") from None

    def read(self, i: int) -> dict[str, np.ndarray]:
        if self._cache is not None:
            sample, self._cache[i] = self._cache[i], None
            if sample is not None:
                return sample
        j = int(self.index[i]) if self.index is not None else self.offset + i  # the object's index
        return self.schema.encode(self.get(j), j)[0]

    def read_rows(self, i: int, n: int) -> dict[str, np.ndarray] | None:
        """Samples ``i`` to at most ``i + n - 1`` as one array of rows per field, where the object is an Arrow
        table whose columns are numbers or fixed-shape arrays (views of its batch: no Python per row); else None."""
        if not self.arrow or self.index is not None or self._cache is not None:
            return None
        if self._rows is None:
            self._rows = ArrowRows(self.ref.get())
        cols = self._rows.rows(self.offset + i, n)
        return self.schema.encode_rows(cols, len(next(iter(cols.values())))) if cols else None

    def load_rows(self) -> dict[str, int]:
        """Read every sample of this part into memory (a shard's worth) and count the rows of its ragged fields."""
        self._cache = [self.read(i) for i in range(self.count)]
        return {f.name: sum(int(s[f.name].shape[0]) for s in self._cache if s is not None)
                for f in self.fields if f.ragged}

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:  # Python objects: no files
        return [], []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "type": self.type_name, "samples": self.count}


def object_source(obj: Any, config: ConvertConfig, progress: Progress | None, ref: ObjectRef,
                  names: Sequence[str] | None, ragged: Sequence[str]) -> ObjectSource:
    """Check a map-style or Arrow-backed ``obj`` (its schema from the first samples; every sample when
    there are keys or ``skip_bad``) and return it as a Source."""
    arrow = is_arrow(obj)
    n = obj.num_rows if arrow and hasattr(obj, "num_rows") else len(obj)
    if n == 0:
        raise UsageError(f"{type_name_of(obj)}: has no samples")
    src = ObjectSource(ref, SampleSchema((), None, False), n, 0, type_name_of(obj), arrow)
    first: list[tuple[int, Any]] = []  # for the schema (with skip_bad, the first ones the object could give)
    for j in range(n):
        if len(first) == PROBE_SAMPLES:
            break
        try:
            first.append((j, src.get(j)))
        except DataError:
            if not config.skip_bad:
                raise
    if not first:
        src.get(0)  # raises: the first sample's error is the one to show
    schema = infer_schema(first, names, ragged, config)
    encoded = []
    for j, s in first:
        try:
            encoded.append((j, s, schema.encode(s, j)[0]))
        except DataError:
            if not config.skip_bad:
                raise
    checked = not encoded  # (skip_bad) every first sample is bad: the check pass finds the good ones, or says none is
    if checked:
        src = _check_all(replace(src, schema=schema, nbytes_est=0), config, progress)
        j = int(src.index[0]) if src.index is not None else 0  # (samples were left out: index is set)
        encoded = [(j, None, schema.encode(src.get(j), j)[0])]
    src = replace(src, schema=schema, nbytes_est=int(np.ceil(np.mean([sum(a.nbytes for a in e.values())
                                                                       for _, _, e in encoded]))))
    if not arrow:
        _warn_if_random(src, encoded[0][0], encoded[0][2])
    if (schema.keyed or config.skip_bad) and not checked:
        src = _check_all(src, config, progress)
    return src


def type_name_of(obj: Any) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


def _rng_states() -> tuple[Any, ...]:
    """The global random generators' states (Python, numpy, torch when imported)."""
    states: list[Any] = [random.getstate(), pickle.dumps(np.random.get_state())]
    torch = sys.modules.get("torch")
    if torch is not None:
        states.append(torch.random.get_rng_state().numpy().tobytes())
    return tuple(states)


def _warn_if_random(src: ObjectSource, j: int, a: dict[str, np.ndarray]) -> None:
    """Warn when ``__getitem__`` draws from a global generator, or gives sample ``j`` (encoded: ``a``) differently twice."""
    before = _rng_states()
    again = src.get(j)
    drew = _rng_states() != before
    b = src.schema.encode(again, j)[0]
    if drew or a.keys() != b.keys() or not all(np.array_equal(a[k], b[k]) for k in a):
        warnings.warn(f"{src.type_name}.__getitem__ is random (it draws from a global random generator, or gives "
                      f"sample {j} differently twice): the conversion stores one draw of each sample. Convert the "
                      "deterministic loading and apply random transforms when reading (docs/convert.md, "
                      "'From your own Dataset')", UserWarning, stacklevel=4)


def _check_range(src: ObjectSource, a: int, b: int) -> list[tuple[int, str | None, str | None]]:
    """(index, key, problem) of samples ``a..b-1``: a worker's share of the check pass."""
    out: list[tuple[int, str | None, str | None]] = []
    for j in range(a, b):
        try:
            out.append((j, src.schema.encode(src.get(j), j)[1], None))
        except DataError as e:
            out.append((j, None, str(e)))
    return out


def _check_all(src: ObjectSource, config: ConvertConfig, progress: Progress | None) -> ObjectSource:
    """Read every sample once (in worker processes): their keys, and the bad ones (skipped, or an error)."""
    n = src.count
    if progress is not None:
        progress.start(n, src.nbytes_est * n, desc="checking")
    tasks = [(src, a, min(a + BATCH_ROWS, n)) for a in range(0, n, BATCH_ROWS)]
    results = map_tasks(_check_range, tasks, config.write.workers, progress, lambda r: src.nbytes_est * len(r))
    bad = [(f"sample {j}", why) for j, _, why in results if why is not None]
    if bad and not config.skip_bad:
        raise DataError(f"{bad[0][1]} (pass %(skip_bad=True) to skip such samples)")
    good = [(j, key) for j, key, why in results if why is None]
    keys = kept_keys(src.type_name, [key if key is not None else str(j) for j, key in good], src.schema.keyed, bad)
    index = np.array([j for j, _ in good], dtype=np.int64) if bad else None
    return replace(src, index=index, count=len(good), keys=keys, skipped=bad)


def kept_keys(type_name: str, keys: list[str], keyed: bool, skipped: list[tuple[str, str]]) -> list[str] | None:
    """The keys of the samples kept (None: keyed by index, as when no key was given and none was skipped);
    no sample kept, or two with one key, is an error before anything is written."""
    if not keys:
        raise DataError(f"{type_name}: every sample is bad, e.g. {skipped[0][1]}")
    seen: dict[str, int] = {}
    for i, k in enumerate(keys):
        if seen.setdefault(k, i) != i:
            raise DataError(f"samples {seen[k]} and {i} have the same key {k!r}")
    return keys if keyed or skipped else None


@dataclass(eq=False)  # hashable: PerProcessHandle tracks open handles in a WeakSet
class SpoolSource(PerProcessHandle[int]):
    """Encoded samples in a spool file (each sample's arrays' raw bytes in ``fields`` order, at ``offsets``;
    dtypes and shapes from the fields and the ragged rows: nothing to unpickle), read with ``pread``."""

    path: str
    offsets: np.ndarray  # count + 1 byte offsets, of this part's samples
    fields: list[FieldSpec]
    nbytes: np.ndarray
    rows: dict[str, np.ndarray]
    type_name: str
    keys: list[str] | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kind: str = "python-iterable"
    classes: list[str] | None = None

    def __len__(self) -> int:
        return len(self.nbytes)

    @property
    def bytes_in(self) -> int:
        return int(self.nbytes.sum())

    def sample_nbytes(self) -> np.ndarray:
        return self.nbytes

    def ragged_rows(self, name: str) -> np.ndarray:
        return self.rows[name]

    def sample_keys(self) -> list[str] | None:
        return self.keys

    def part(self, start: int, stop: int) -> "SpoolSource":
        return replace(self, offsets=self.offsets[start:stop + 1], nbytes=self.nbytes[start:stop],
                       rows={k: v[start:stop] for k, v in self.rows.items()}, keys=None)

    def _open_handle(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    @staticmethod
    def _close_handle(handle: Any) -> None:
        os.close(handle)

    def read(self, i: int) -> dict[str, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        data = os.pread(self.handle(), b - a, a)
        if len(data) != b - a:
            raise FastdataError(f"{self.path}: the conversion's spool file is shorter than written")
        out: dict[str, np.ndarray] = {}
        pos = 0
        for f in self.fields:
            shape = (int(self.rows[f.name][i]), *f.trailing) if f.ragged else f.trailing
            n = int(np.prod(shape, dtype=np.int64)) * f.np_dtype.itemsize
            out[f.name] = np.frombuffer(data, dtype=f.np_dtype, count=n // f.np_dtype.itemsize, offset=pos).reshape(shape)
            pos += n
        return out

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:  # Python objects: no files
        return [], []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "type": self.type_name, "samples": len(self)}


def _samples(it: Iterable[Any], type_name: str) -> Iterable[tuple[int, Any]]:
    """The iterable's samples with their index; its own errors become a DataError naming the index."""
    iterator = iter(it)
    for i in itertools.count():
        try:
            s = next(iterator)
        except StopIteration:
            return
        except FastdataError:
            raise
        except Exception as e:
            raise DataError(f"sample {i}: iterating {type_name} raised {type(e).__name__}: {e}") from None
        yield i, s


def spool_iterable(it: Iterable[Any], path: str, config: ConvertConfig, names: Sequence[str] | None,
                   ragged: Sequence[str]) -> SpoolSource:
    """Read ``it`` once into the spool file ``path``: every sample checked against the first samples' schema
    (a bad one is an error naming its index, or skipped with ``skip_bad``)."""
    type_name = type_name_of(it)
    samples = iter(_samples(it, type_name))
    head = list(itertools.islice(samples, PROBE_SAMPLES))
    if not head:
        raise UsageError(f"{type_name}: has no samples")
    schema = infer_schema(head, names, ragged, config)
    offsets, nbytes, keys, skipped = [0], [], [], []
    rows: dict[str, list[int]] = {f.name: [] for f in schema.fields if f.ragged}
    with open(path, "wb") as out:
        for i, raw in itertools.chain(head, samples):
            try:
                arrays, key = schema.encode(raw, i)
            except DataError as e:
                if not config.skip_bad:
                    raise DataError(f"{e} (pass %(skip_bad=True) to skip such samples)") from None
                skipped.append((f"sample {i}", str(e)))
                continue
            size = 0
            for f in schema.fields:
                size += out.write(np.ascontiguousarray(arrays[f.name], dtype=f.np_dtype).data)
            offsets.append(offsets[-1] + size)
            nbytes.append(sum(a.nbytes for a in arrays.values()))
            keys.append(key if key is not None else str(i))
            for name, r in rows.items():
                r.append(int(arrays[name].shape[0]))
    use_keys = kept_keys(type_name, keys, schema.keyed, skipped)
    return SpoolSource(path, np.asarray(offsets, dtype=np.int64), schema.fields, np.asarray(nbytes, dtype=np.int64),
                       {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}, type_name, use_keys, skipped)


def read_mode(obj: Any) -> str:
    """``arrow``, ``map`` (indexed) or ``iterable``; anything else is a UsageError."""
    if is_arrow(obj):
        return "arrow"
    if isinstance(obj, Mapping):
        raise UsageError(f"a {type(obj).__name__} is not a dataset: give a Dataset, a list of samples or an iterable")
    data = sys.modules.get("torch.utils.data")
    iterable_ds = data is not None and isinstance(obj, data.IterableDataset)
    if not iterable_ds and hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return "map"
    if hasattr(obj, "__iter__"):
        return "iterable"
    raise UsageError(f"{type_name_of(obj)}: not a source fastdata can convert (a path, a Dataset with __len__ and "
                     "__getitem__, an iterable of samples, or a Hugging Face dataset)")


@contextmanager
def python_source(obj: Any, config: ConvertConfig, progress: Progress | None, names: Sequence[str] | None,
                  ragged: Sequence[str], dst: Path) -> Iterator[Source]:
    """The Source of ``obj``, valid while the context lasts (the object stays reachable from the workers; an
    iterable's spool, beside ``dst``, exists)."""
    for opt, name in ((config.meta_types, "meta_types"), (config.no_labels, "no_labels"), (config.strict, "strict"),
                      (config.labels_columns, "labels_columns")):
        if opt:
            raise UsageError(f"%({name}) applies to file sources, not to Python objects")
    for given, what in ((names, "fields"), (ragged, "ragged")):
        if given is not None and (isinstance(given, str) or not all(isinstance(n, str) for n in given)):
            raise UsageError(f"%({what}) must be a tuple of field names, not {given!r}")
    mode = read_mode(obj)
    if mode != "iterable":
        with live(obj, config.write.workers or usable_cpus()) as ref:
            yield object_source(obj, config, progress, ref, names, ragged)
        return
    parent = dst.parent if dst.parent.is_dir() else None
    if parent is not None:
        _remove_dead_spools(parent)
    with tempfile.TemporaryDirectory(prefix=_SPOOL_PREFIX, dir=parent, ignore_cleanup_errors=True) as tmp:
        with _spool_lock(tmp):
            yield spool_iterable(obj, os.path.join(tmp, "samples.spool"), config, names, ragged)



@contextmanager
def _spool_lock(tmp: str) -> Iterator[None]:
    """Hold a flock on ``tmp/lock`` while the spool is in use: the kernel drops it when this process dies (a
    SIGKILL skips the removal of the spool, a copy of every sample), which tells a later conversion to remove it."""
    fd = os.open(os.path.join(tmp, "lock.tmp"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(os.path.join(tmp, "lock.tmp"), os.path.join(tmp, "lock"))  # only ever seen locked
        yield
    finally:
        os.close(fd)


def _remove_dead_spools(parent: Path) -> None:
    """Remove the spools beside DST left by killed conversions: those whose lock no process holds."""
    for entry in os.scandir(parent):
        if not (entry.name.startswith(_SPOOL_PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        try:
            fd = os.open(os.path.join(entry.path, "lock"), os.O_RDWR)
        except OSError:
            continue  # not ours, or being made: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live conversion's
        finally:
            os.close(fd)  # (the lock is released with it)
        shutil.rmtree(entry.path, ignore_errors=True)
