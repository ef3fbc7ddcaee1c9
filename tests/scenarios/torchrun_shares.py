"""Under ``torchrun --nproc_per_node 2``: a loader built BEFORE init_process_group splits the data
once the group exists. ``python -m torch.distributed.run --nproc_per_node 2 torchrun_shares.py DATA OUT``
writes OUT/rank-<r>.json: the labels of each epoch (2 epochs) and len(loader)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

import fastdata

data, out = sys.argv[1], Path(sys.argv[2])
loader = fastdata.loader(data, 4, seed=5, device="cpu", num_workers=2)  # no process group yet
dist.init_process_group("gloo")
epochs = [[label for b in loader for label in b["label"].tolist()] for _ in range(2)]
(out / f"rank-{dist.get_rank()}.json").write_text(
    __import__("json").dumps({"epochs": epochs, "len": len(loader), "state": loader.state_dict()}))
loader.close()
dist.destroy_process_group()
