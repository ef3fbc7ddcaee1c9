"""What a folder without ``manifest.json`` is, told from the names in it, so that the error names the fix
that works (``--resume``, ``merge-parts`` or ``fastdata convert``)."""

from __future__ import annotations

import os
from pathlib import Path

from fastdata.errors import FormatError, IncompleteDatasetError
from fastdata.format.files import JOURNAL_NAME, OURS, PART_JOURNAL, PART_RECORD, SOURCE_SUFFIXES
from fastdata.format.spec import MANIFEST_NAME

_LOOK = 2000  # names looked at in sub-folders, at most: enough to tell, cheap on a huge folder


def not_a_folder_error(root: Path) -> FormatError:
    """The error for a dataset path that is no folder: missing, a source file, or some other file."""
    if not os.path.lexists(root):
        return FormatError(f"{root}: no such folder (a fastdata dataset is the folder fastdata convert wrote)")
    if root.name.lower().endswith(SOURCE_SUFFIXES):
        return FormatError(f"{root}: a source file, not a fastdata dataset (a dataset is a folder); convert it with "
                           f"`fastdata convert {root} DST`, then open DST")
    return FormatError(f"{root}: not a directory (a fastdata dataset is a directory)")


def no_manifest_error(root: Path | str, names: set[str] | None = None) -> FormatError:
    """The error for the folder ``root`` (or a URL whose ``names`` are listed), which has no manifest: what
    the folder is, and what to do."""
    names = set(os.listdir(root)) if names is None else names
    if JOURNAL_NAME in names:
        return IncompleteDatasetError(
            f"{root}: incomplete dataset: no {MANIFEST_NAME} (the conversion did not finish: run the same "
            "fastdata convert command with --resume to finish it, or with --overwrite to start over)")
    if any(PART_RECORD.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: parts of a conversion split with --part I/N, not merged yet (no {MANIFEST_NAME}): once every "
            f"part is done, run fastdata merge-parts {root}")
    if any(PART_JOURNAL.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: an unfinished part of a conversion split with --part I/N (no {MANIFEST_NAME}): finish each "
            f"part with its fastdata convert command plus --resume, then run fastdata merge-parts {root}")
    if any(OURS.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: incomplete dataset: a conversion started here but left no {MANIFEST_NAME} and no journal to "
            "resume from; convert again with --overwrite")
    if not names:
        return FormatError(f"{root}: an empty folder, not a fastdata dataset (no {MANIFEST_NAME})")
    if _holds_source_files(root, names):
        return FormatError(f"{root}: this is a source folder, not a fastdata dataset (no {MANIFEST_NAME}); convert "
                           f"it with `fastdata convert {root} DST`, then open DST")
    return FormatError(f"{root}: not a fastdata dataset (no {MANIFEST_NAME}); a dataset is the folder that "
                       "fastdata convert wrote")


def _holds_source_files(root: Path | str, names: set[str]) -> bool:
    """Whether ``root`` or one of its sub-folders (class folders; not of a URL) holds .npy, image or table files."""
    if any(n.lower().endswith(SOURCE_SUFFIXES) for n in names):
        return True
    if not isinstance(root, Path):  # a URL: its sub-folders are not looked into
        return False
    looked = 0
    for n in sorted(names):
        try:
            with os.scandir(root / n) as it:
                for e in it:
                    looked += 1
                    if e.name.lower().endswith(SOURCE_SUFFIXES):
                        return True
                    if looked >= _LOOK:
                        return False
        except OSError:  # a file, or a folder we may not read
            continue
    return False
