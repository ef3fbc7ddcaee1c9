"""Which Python object is which source: an Arrow-backed dataset, a map-style Dataset (read in the workers),
or an iterable (one producer, then a spool); ``fastdata.convert`` calls :func:`python_source`."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from fastdata.converters.arrow_rows import is_arrow
from fastdata.converters.config import ConvertConfig
from fastdata.converters.object_spool import spool_iterable
from fastdata.converters.objects import live, object_source, type_name_of
from fastdata.errors import UsageError
from fastdata.world import usable_cpus
from fastdata.write import Progress, Source


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
    for opt, name in ((config.meta_types, "meta_types"), (config.no_labels, "no_labels"), (config.strict, "strict")):
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
