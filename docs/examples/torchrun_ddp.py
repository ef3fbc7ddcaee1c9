"""Plain DDP under torchrun. Usage: torchrun --nproc_per_node 2 torchrun_ddp.py DATASET_DIR"""

import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before init_process_group: see "Ending a DDP script" in integrations.md

import fastdata


def train(loader: fastdata.Loader) -> None:
    """Two epochs of DDP; the model (which holds the process group) is freed when this returns."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1).to(loader.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _epoch in range(2):  # each epoch: a new order, split into equal disjoint shares
        samples = 0
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["label"].float())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            samples += len(batch["label"])
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {samples} samples per epoch")


# The loader may be built before or after init_process_group: it reads the rank when each epoch starts.
with fastdata.loader(sys.argv[1], batch_size=4, seed=0, num_workers=2) as loader:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    train(loader)
    dist.destroy_process_group()  # nothing holds the group now: its threads end here, not at exit
