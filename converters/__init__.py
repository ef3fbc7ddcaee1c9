"""Sources ``fastdata.convert`` reads (installed as ``fastdata.converters``): one module per kind of input,
each registered in :mod:`.registry`; objects.py makes the Source of Python objects."""

from __future__ import annotations

from fastdata.converters import arrays, images, table  # noqa: F401  (each registers its source kind)
from fastdata.converters.config import ConvertConfig, ImageOptions
from fastdata.converters.registry import DEFAULT_FIELD, SOURCES, Request, detect, src_form
from fastdata.converters.table_read import ColumnType, parse_meta_type

__all__ = ["ColumnType", "ConvertConfig", "DEFAULT_FIELD", "ImageOptions", "Request", "SOURCES", "detect",
           "parse_meta_type", "src_form"]
