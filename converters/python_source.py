"""Which Python object is which source: an Arrow-backed dataset, a map-style Dataset (read in the workers,
objects.py), or an iterable: read once, each sample checked and encoded into a spool file beside the destination,
from which the workers write the shards (the spool is removed at the end); ``fastdata.convert`` calls
:func:`python_source`."""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from fastdata.converters.config import ConvertConfig
from fastdata.converters.objects import PROBE_SAMPLES, is_arrow, kept_keys, live, object_source, type_name_of
from fastdata.converters.sample_fields import infer_schema
from fastdata.errors import DataError, FastdataError, UsageError
from fastdata.format import FieldSpec
from fastdata.handles import PerProcessHandle
from fastdata.world import usable_cpus
from fastdata.write import Progress, Source


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
    with tempfile.TemporaryDirectory(prefix=".fastdata-spool-", dir=parent, ignore_cleanup_errors=True) as tmp:
        yield spool_iterable(obj, os.path.join(tmp, "samples.spool"), config, names, ragged)
