"""The tuned-settings cache in the user's cache directory: what ``fastdata tune`` measured best per
dataset, batch size, device and machine, read by ``fastdata.loader(num_workers="auto")``."""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdata.fileio import user_cache_dir, write_atomic
from fastdata.world import usable_cpus

if TYPE_CHECKING:
    from fastdata.reading.dataset import Dataset

CACHE_FILE = "tuned.json"


def machine_id() -> str:
    """What makes timings comparable: host, CPU model, usable cores."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()}|{cpu or platform.processor()}|{usable_cpus()}"


def settings_key(ds: Dataset, batch_size: int, device: str, transform: Any = None) -> str:
    """Same dataset content (shard checksums), batch size, device type, machine and transform -> same key."""
    h = hashlib.sha256()
    for s in ds.manifest.shards:
        h.update(s.checksum.encode())
    h.update(f"|{','.join(f.name for f in ds.schema)}|{batch_size}|{device}|{machine_id()}".encode())
    if transform is not None:  # settings raced with a transform fit only loaders that run it
        fn = getattr(transform, "fn", transform)  # a PerSample: its function
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        h.update(f"|transform={getattr(fn, '__module__', '?')}.{name}".encode())
    return h.hexdigest()[:32]


def load_tuned(ds: Dataset, batch_size: int, device: str, transform: Any = None) -> dict[str, Any] | None:
    """Stored settings for this dataset/batch size/device (and transform) on this machine, or None."""
    entry = _read_cache(user_cache_dir() / CACHE_FILE).get(settings_key(ds, batch_size, device, transform))
    if not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict):
        return None
    return entry["settings"]


def store_tuned(ds: Dataset, batch_size: int, device: str, settings: dict[str, Any], rate: float,
                transform: Any = None) -> Path:
    """Remember the winner (atomic write of the cache file)."""
    d = user_cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / CACHE_FILE
    data = _read_cache(path)
    data[settings_key(ds, batch_size, device, transform)] = {
        "settings": settings, "samples_per_s": rate, "dataset": str(ds.root.resolve()) if isinstance(ds.root, Path) else ds.root, "batch_size": batch_size,
        "device": device, "machine": machine_id(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    text = json.dumps(data, indent=1) + "\n"
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))
    return path


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache file's entries; empty when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


