"""Sources: what ``fastdata.convert`` reads, one module per kind of input, each registered in one table.

Installed as ``fastdata.converters`` (the repository keeps the folder at its top level). A source kind
(:class:`.registry.SourceKind`) has a ``name``, a ``src_form(src)`` that says what SRC itself is when
the kind takes it as a whole (a table, a file of named arrays), a ``detect(request)`` that says whether
it takes the input, and a ``scan(request, config, progress)`` that checks the whole input before
anything is written and returns the :class:`fastdata.write.Source` the write engine reads. Importing a
kind's module registers it; adding a source is one module plus its import below. Python objects (a
Dataset, an iterable, a Hugging Face dataset) are not paths: python_source.py makes their Source.
"""

from __future__ import annotations

from fastdata.converters import arrays, h5source, image_folder, npy_folder, table  # noqa: F401  (each registers its source kind)
from fastdata.converters.config import ConvertConfig
from fastdata.converters.image_codec import ImageOptions
from fastdata.converters.registry import (
           DEFAULT_FIELD,
           SOURCES,
           Request,
           SourceKind,
           SrcForm,
           detect,
           register,
           src_form,
)
from fastdata.converters.table_types import ColumnType, parse_meta_type

__all__ = ["ColumnType", "ConvertConfig", "DEFAULT_FIELD", "ImageOptions", "Request", "SOURCES", "SourceKind",
           "SrcForm", "detect", "parse_meta_type", "register", "src_form"]
