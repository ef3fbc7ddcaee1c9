"""Lightning DDP on 2 CPU processes with a fastdata loader: ``python lightning_ddp.py DATA OUT STRATEGY WHERE``.

STRATEGY: ``ddp`` (Lightning re-runs this script as the second process) or ``ddp_spawn`` (the
loader is pickled to spawned processes). WHERE: ``script`` builds the loader here, before the
trainer starts the process group; ``hooks`` builds it in ``train_dataloader()``. Each rank writes
OUT/rank-<r>.json (scenarios/recorder.py): [epoch, labels of the batch] per training step, len(loader).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: scenarios.kit

import fastdata  # noqa: E402
from scenarios.kit import lightning_module, quiet_trainer  # noqa: E402


def main(data: str, out: str, strategy: str, where: str) -> None:
    loader = fastdata.loader(data, 4, seed=11, device="cpu", num_workers=2) if where == "script" else None
    model = lightning_module(data=data if where == "hooks" else None, out=out)
    quiet_trainer(strategy=strategy, devices=2, max_epochs=2).fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main(*sys.argv[1:5])
