"""Accelerate: prepare, checkpoint and resume mid-epoch. Usage: python accelerate_resume.py DATASET_DIR CKPT_DIR"""

import sys

import torch
from accelerate import Accelerator

import fastdata

data, ckpt = sys.argv[1], sys.argv[2]


def setup():
    accelerator = Accelerator()
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    # fastdata splits by rank itself; prepare() returns the loader unchanged.
    train = fastdata.loader(data, batch_size=4, seed=0, num_workers=2, device=accelerator.device)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    accelerator.register_for_checkpointing(train)  # its position goes into save_state
    return accelerator, model, optimizer, train


def step(accelerator, model, optimizer, batch):
    loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["label"].float())
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


# First run: epoch 0, then stop after 4 batches of epoch 1 with a checkpoint.
accelerator, model, optimizer, train = setup()
for epoch in range(2):
    for k, batch in enumerate(train):
        step(accelerator, model, optimizer, batch)
        if epoch == 1 and k == 3:
            accelerator.save_state(ckpt)
            break
train.close()

# Second run: restore, finish epoch 1, then train epoch 2.
accelerator, model, optimizer, train = setup()
accelerator.load_state(ckpt)  # the loader is back at epoch 1, batch 4
state = train.state_dict()
print(f"resumed at epoch {state['epoch']}, batch {state['batches_done']}")
for _epoch in range(state["epoch"], 3):
    for batch in train:  # the rest of epoch 1, then all of epoch 2
        step(accelerator, model, optimizer, batch)
train.close()
print("done")
