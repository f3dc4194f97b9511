"""A distributed sampler that resumes at the exact sample where the run stopped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler


class ResumableDistributedSampler:
    """Deterministic per-epoch shuffle; each rank takes a disjoint strided slice.

    Its state is the epoch and the number of batches the gang has consumed in
    it, the same on every rank, so a checkpoint taken after step N resumes at
    batch N + 1: no sample skipped, none repeated.
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        if batch_size * world_size > dataset_len:
            raise ValueError(
                f"batch_size {batch_size} x {world_size} ranks exceeds the {dataset_len} samples"
            )
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.world_size = world_size
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.batches_done = 0  # in the current epoch, counted per rank (same on every rank)

    @property
    def batches_per_epoch(self) -> int:
        # drop the tail so every rank runs the same number of steps
        return self.dataset_len // (self.batch_size * self.world_size)

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.dataset_len)
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.dataset_len, generator=generator)

    def batches(self) -> Iterator[torch.Tensor]:
        """Index batches for this rank from the current position to the end of the epoch."""
        order = self._order()
        usable = self.batches_per_epoch * self.batch_size * self.world_size
        mine = order[:usable][self.rank :: self.world_size]
        while self.batches_done < self.batches_per_epoch:
            start = self.batches_done * self.batch_size
            batch = mine[start : start + self.batch_size]
            self.batches_done += 1
            yield batch
        self.epoch += 1
        self.batches_done = 0

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, int], *, elastic: bool = False) -> None:
        """Resume where ``state`` stopped.

        With the same gang shape, exactly (no sample skipped or repeated). An
        elastic gang may resume on a different number of ranks: the epoch's
        order is the same whatever the world size and the gang has consumed a
        prefix of it, so it resumes at that prefix rounded down to a whole
        batch of the new shape (fewer than one global batch is seen twice,
        none is skipped).
        """
        if state["batch_size"] != self.batch_size or (
            state["world_size"] != self.world_size and not elastic
        ):
            raise ValueError(
                "resuming with a different world size or batch size would change "
                "the sample order; resume with the same gang shape"
            )
        self.epoch = int(state["epoch"])
        # batches of batch_size the whole gang consumed: the epoch's order up to there
        consumed = int(state["batches_done"]) * int(state["world_size"])
        self.batches_done = consumed // self.world_size
        self.seed = int(state["seed"])


class ResumableSampler(DistributedSampler):  # type: ignore[type-arg]
    """``torch.utils.data.DistributedSampler`` that resumes mid-epoch: a drop-in.

    The same arguments and the same order as ``DistributedSampler`` (an
    uninterrupted run is unchanged), plus ``state_dict()``: the epoch and how
    many of its samples this rank has drawn. Restored, the next epoch's
    iteration continues at the sample where the run stopped, so no sample is
    skipped or repeated. Exact when the DataLoader has ``num_workers=0``; with
    worker processes the loader draws up to ``prefetch_factor * num_workers``
    batches ahead, and those are skipped on resume.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.position = 0  # samples of the current epoch this rank has drawn
        self._finished = False  # an iteration in this process ran to its end

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.position = 0
        self._finished = False
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        if self._finished:  # iterated again without set_epoch: from the start, as upstream
            self.position = 0
            self._finished = False
        indices = list(super().__iter__())
        for index in indices[self.position :]:
            self.position += 1
            yield index
        self._finished = True

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_replicas": self.num_replicas,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, int], *, elastic: bool = False) -> None:
        """Continue where ``state`` stopped; an ``elastic`` gang may have another size.

        On another number of ranks the gang resumes at the samples all ranks
        had drawn together, rounded down to this shape (fewer than one sample
        per rank is drawn twice, none is skipped).
        """
        if int(state["seed"]) != self.seed:
            raise ValueError(f"the checkpoint's sampler seed {state['seed']} is not {self.seed}")
        replicas = int(state["num_replicas"])
        if replicas != self.num_replicas and not elastic:
            raise ValueError(
                f"the checkpoint was written by {replicas} ranks, this gang has "
                f"{self.num_replicas}: resuming would change the sample order"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"]) * replicas // self.num_replicas
        self._finished = False
