"""One seed derivation for every random draw: a numpy ``SeedSequence`` of ``(seed, epoch, stream, rank,
batch)``, so a draw depends on its position alone (resumes repeat it, ranks differ, backends agree)."""

from __future__ import annotations

import enum

import numpy as np


class Stream(enum.IntEnum):
    """What a random stream is for; part of the seed so the streams never overlap."""

    ORDER = 0  # the epoch's sample order (fastdata.reading.samplers); rank and batch are 0: every rank plans alike
    AUGMENT = 1  # a batch's augmentation parameters (both backends)
    DALI = 2  # DALI's own random operators, seeded once per pass (batch = the pass's first batch)
    SAMPLER = 3  # samplers that draw (weighted, episodic)
    SPLIT = 4  # Dataset.split (epoch, rank and batch are 0)
    TRANSFORM = 5  # the generator a user's transform gets with each batch (fastdata.loaders.transform)


def seed_sequence(seed: int, epoch: int, stream: Stream, rank: int = 0, batch: int = 0) -> np.random.SeedSequence:
    """The seed sequence of one stream at one position; ``seed`` is any integer in [0, 2**64)."""
    if not 0 <= seed < 1 << 64 or epoch < 0 or rank < 0 or batch < 0:  # 2**64 would be seed 0 again
        raise ValueError(f"seed must be in [0, 2**64), epoch, rank and batch >= 0 (got {seed}, {epoch}, {rank}, {batch})")
    return np.random.SeedSequence([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, epoch, int(stream), rank, batch])


def numpy_rng(seed: int, epoch: int, stream: Stream, rank: int = 0, batch: int = 0) -> np.random.Generator:
    """A numpy generator for the stream (see :func:`seed_sequence`)."""
    return np.random.default_rng(seed_sequence(seed, epoch, stream, rank, batch))


def int_seed(seed: int, epoch: int, stream: Stream, rank: int = 0, batch: int = 0, bits: int = 63) -> int:
    """A non-negative integer seed of ``bits`` bits for libraries with their own generators (torch, DALI)."""
    state = seed_sequence(seed, epoch, stream, rank, batch).generate_state(2, np.uint32)
    return ((int(state[0]) << 32) | int(state[1])) & ((1 << bits) - 1)
