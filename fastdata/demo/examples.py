"""The models and the naive baseline the docs' examples import (``from fastdata.demo.examples import
TinyNet``): they live in fastdata.demo (models.py, baseline.py); this is their documented path."""

from __future__ import annotations

from fastdata.demo.baseline import naive_loader, write_npy_folder
from fastdata.demo.models import FlimCNN, TinyNet, classification_loss

__all__ = ["FlimCNN", "TinyNet", "classification_loss", "naive_loader", "write_npy_folder"]
