"""Shards uploaded to object storage by the process that wrote them: staged locally, uploaded to ``URL/<name>``
(retried within a time bound), deleted locally; a retried or duplicated task uploads the same bytes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdata.errors import RemoteNotFoundError
from fastdata.format import ShardInfo
from fastdata.remote import RemoteOptions, filesystem, join, with_retries
from fastdata.remote.cache import pid_alive

WORKERS_DIR = "workers"  # under <cache>/uploads/: one folder per writing process, <host>-<pid>


@dataclass(frozen=True)
class UrlSpec:
    """Where a worker uploads shards: ``url`` (as :func:`fastdata.remote.root` gives it), with the
    ``options`` of the conversion (never printed: their storage options may hold credentials)."""

    url: str
    options: RemoteOptions = field(default_factory=RemoteOptions, repr=False)

    def filesystem(self) -> Any:
        return filesystem(self.url, self.options.storage_options)

    def deadline(self) -> float:
        return time.monotonic() + self.options.timeout

    def sizes(self, fs: Any) -> dict[str, int]:
        """Every name under the URL with its size, from one listing."""
        try:
            entries = with_retries(lambda: fs.ls(self.url, detail=True, refresh=True), self.url, self.deadline())
        except RemoteNotFoundError:
            return {}
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in entries}

    def upload(self, local: Path, name: str, fs: Any) -> None:
        """``local`` -> ``URL/name`` (a whole-object PUT: readers never see half of it)."""
        where = join(self.url, name)
        with_retries(lambda: fs.put_file(str(local), where), f"{where}: upload", self.deadline())

    def read(self, name: str, fs: Any) -> bytes:
        where = join(self.url, name)
        return with_retries(lambda: fs.cat_file(where), where, self.deadline())

    def remove(self, name: str, fs: Any) -> None:
        """Delete ``URL/name`` (nothing when it is not there)."""
        where = join(self.url, name)
        try:
            with_retries(lambda: fs.rm_file(where), where, self.deadline())
        except RemoteNotFoundError:
            pass


@dataclass
class UrlPublisher:
    """Where a finished shard goes when DST is a URL: written locally, uploaded, deleted (as
    fastdata/write/shard_task.py's LocalPublisher renames)."""

    spec: UrlSpec
    _fs: Any = field(default=None, repr=False)

    def fs(self) -> Any:
        if self._fs is None:
            self._fs = self.spec.filesystem()
        return self._fs

    def local_path(self, name: str) -> Path:
        return staging_dir(self.spec) / f".{name}.partial"

    def publish(self, tmp: Path, name: str) -> None:
        try:
            self.spec.upload(tmp, name, self.fs())
        finally:
            _remove_local(tmp)  # uploaded, or failed: a retry writes it again from the source

    def intact(self, name: str, expect: ShardInfo) -> bool:
        """The object is there with the journaled size (what ``--resume`` to a URL checks: hashing it
        would mean downloading it)."""
        return self.size(name) == expect.bytes

    def size(self, name: str) -> int | None:
        """The size of ``URL/name``, or None when there is no such object."""
        fs, where = self.fs(), self.where(name)

        def size() -> int:
            fs.invalidate_cache(where)  # never a listing cached earlier: another process uploaded it
            return int(fs.info(where)["size"])

        try:
            return with_retries(size, where, self.spec.deadline())
        except RemoteNotFoundError:
            return None

    def where(self, name: str) -> str:
        return join(self.spec.url, name)

    def discard(self, tmp: Path) -> None:
        _remove_local(tmp)


def staging_dir(spec: UrlSpec) -> Path:
    """This process's staging folder, ``<cache>/uploads/workers/<host>-<pid>``; folders left by dead
    processes of this host (a killed worker's half-written shard) are removed on the way."""
    root = spec.options.cache_path() / "uploads" / WORKERS_DIR
    host = socket.gethostname()
    mine = root / f"{host}-{os.getpid()}"
    if not mine.is_dir():  # (removed after each upload, when empty)
        while not mine.is_dir():  # a conversion ending meanwhile may remove the empty folders above it
            with contextlib.suppress(FileNotFoundError):
                mine.mkdir(parents=True, exist_ok=True)
        for d in root.iterdir():
            stem, _, pid = d.name.rpartition("-")
            if stem == host and pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
    return mine


def _remove_local(tmp: Path) -> None:
    """Remove a local shard file (and an LMDB lock file beside it), and its staging folder once empty."""
    tmp.unlink(missing_ok=True)
    Path(f"{tmp}-lock").unlink(missing_ok=True)
    remove_empty(tmp.parent)


def remove_empty(*folders: Path) -> None:
    """Remove each of ``folders`` that is empty, in order (a staging folder, then those above it)."""
    for d in folders:
        try:
            d.rmdir()
        except OSError:  # not empty (another process stages there), or gone already
            pass


__all__ = ["UrlPublisher", "UrlSpec", "WORKERS_DIR", "remove_empty", "staging_dir"]
