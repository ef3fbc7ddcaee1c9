"""The one table of source kinds: ``convert`` asks each kind whether it takes the input (``detect``).
Exactly one kind may claim a request; a second claim is a bug in the new kind, and says so."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

from fastdata.converters.scan import walk_files
from fastdata.errors import FastdataError, UsageError

if TYPE_CHECKING:
    from fastdata.converters.config import ConvertConfig
    from fastdata.write import Progress, Source

DEFAULT_FIELD = "x"  # the field of a sample file's array, or of a lone array given as SRC
# What SRC itself is, before the request is built: a metadata "table" or a file/store of named "arrays"; else None.
SrcForm = Literal["table", "arrays"]


@dataclass(frozen=True)
class Request:
    """What to convert, checked for consistency: ``src`` (a file or folder; the table's folder when
    SRC was a table), the named ``arrays``, the ``labels`` file and the metadata table ``meta``."""

    src: Path | None
    arrays: dict[str, Path] = field(default_factory=dict)
    labels: Path | None = None
    meta: Path | None = None
    table_src: bool = False  # SRC itself was the table (its paths are relative to its folder)
    in_file: dict[str, str] = field(default_factory=dict)  # field -> array inside SRC (an HDF5 file or glob, Zarr)

    @property
    def inputs(self) -> list[Path]:
        """Every file and folder the conversion reads: DST may be none of them, nor inside one."""
        named = [self.src, self.meta, self.labels, *self.arrays.values()]
        return [p for p in named if p is not None]

    @cached_property
    def files(self) -> list[str]:
        """The files under the folder ``src`` (relative, sorted, the labels file left out), walked once."""
        if self.src is None or not self.src.is_dir():
            return []
        return walk_files(self.src, {os.path.realpath(self.labels)} if self.labels is not None else set())


@dataclass(frozen=True)
class SourceKind:
    """One kind of input: ``detect(req)`` says whether it takes ``req``; ``scan(req, config, progress)`` checks the
    whole input and returns the :class:`fastdata.write.Source` to write (UsageError: an option that does not apply;
    DataError: bad input); ``src_form(src)`` says what SRC is when this kind takes it as a whole (default: never)."""

    name: str
    detect: Callable[[Request], bool]
    scan: Callable[[Request, "ConvertConfig", "Progress | None"], "Source"]
    src_form: Callable[[Path], SrcForm | None] = lambda src: None


SOURCES: dict[str, SourceKind] = {}


def register(kind: SourceKind) -> None:
    """Add ``kind`` to the table (once per name)."""
    if kind.name in SOURCES:
        raise FastdataError(f"source kind {kind.name!r} is registered twice")
    SOURCES[kind.name] = kind


def src_form(src: Path) -> SrcForm | None:
    """What ``src`` itself is, as the one kind that knows it says (None: no kind takes it as a whole)."""
    forms = [(k.name, f) for k in SOURCES.values() if (f := k.src_form(src)) is not None]
    if len(forms) > 1:
        raise FastdataError(f"source kinds {', '.join(n for n, _ in forms)} all say what {src} is: "
                            "their src_form() must not overlap")
    return forms[0][1] if forms else None


def detect(req: Request) -> SourceKind:
    """The one kind that takes ``req``."""
    claims = [k for k in SOURCES.values() if k.detect(req)]
    if len(claims) > 1:
        raise FastdataError(f"source kinds {', '.join(k.name for k in claims)} all claim {req.src}: "
                            "their detect() must not overlap")
    if not claims:
        raise UsageError(f"{req.src}: not a source fastdata can convert (kinds: {', '.join(sorted(SOURCES))})")
    return claims[0]
