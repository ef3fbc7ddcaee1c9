"""What a batch is, for code that accepts fastdata's and other loaders' batches alike."""

from __future__ import annotations

from typing import Any


def batch_len(batch: Any) -> int:
    """Samples in a batch: a dict (its first array or tensor; lists of strings, such as keys, count
    by length) or tuple of arrays/tensors (first entry), or one array."""
    if isinstance(batch, dict):
        values = list(batch.values())
        batch = next((v for v in values if hasattr(v, "shape")), values[0] if values else None)
        if isinstance(batch, list):
            return len(batch)
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0]) if hasattr(batch, "shape") and len(batch.shape) else 1
