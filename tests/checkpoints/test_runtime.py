"""tideflow.runtime pieces that need no process group: sampler, seeds, health, AMP."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tideflow.checkpoint import CheckpointManager
from tideflow.runtime import (
    HealthGuard,
    MixedPrecision,
    ResumableDistributedSampler,
    TrainingDiverged,
    TrainingStalled,
    rng_state,
    seed_everything,
    set_rng_state,
)
from tideflow.runtime.checkpointing import AsyncCheckpointer
from tideflow.runtime.config import EnvConfig
from tideflow.runtime.distributed import DistInfo


def consume(sampler: ResumableDistributedSampler, batches: int) -> list[int]:
    seen: list[int] = []
    iterator = sampler.batches()
    while len(seen) < batches * sampler.batch_size:
        try:
            seen += next(iterator).tolist()
        except StopIteration:
            iterator = sampler.batches()
    return seen


@pytest.mark.parametrize("stop_after", [1, 7, 11, 12, 25])
def test_sampler_resumes_without_skipping_or_repeating(stop_after: int) -> None:
    total = 40  # batches per rank, several epochs of 11
    for rank in range(2):
        straight = ResumableDistributedSampler(100, batch_size=4, world_size=2, rank=rank, seed=3)
        expected = consume(straight, total)
        first = ResumableDistributedSampler(100, batch_size=4, world_size=2, rank=rank, seed=3)
        before = consume(first, stop_after)
        resumed = ResumableDistributedSampler(100, batch_size=4, world_size=2, rank=rank, seed=3)
        resumed.load_state_dict(first.state_dict())
        after = consume(resumed, total - stop_after)
        assert before + after == expected


def test_sampler_ranks_are_disjoint_and_cover_an_epoch() -> None:
    ranks = [
        ResumableDistributedSampler(96, batch_size=4, world_size=3, rank=r, seed=0)
        for r in range(3)
    ]
    epoch = [consume(s, s.batches_per_epoch) for s in ranks]
    flat = [i for part in epoch for i in part]
    assert len(flat) == len(set(flat)) == 96


def test_sampler_refuses_a_different_gang_shape() -> None:
    two = ResumableDistributedSampler(100, batch_size=4, world_size=2, rank=0, seed=0)
    three = ResumableDistributedSampler(100, batch_size=4, world_size=3, rank=0, seed=0)
    with pytest.raises(ValueError, match="same gang shape"):
        three.load_state_dict(two.state_dict())


@pytest.mark.parametrize(("before", "after", "stop_after"), [(2, 1, 7), (3, 2, 5), (1, 4, 9)])
def test_an_elastic_sampler_resumes_on_another_world_size_skipping_nothing(
    before: int, after: int, stop_after: int
) -> None:
    size, batch = 240, 4
    firsts = [
        ResumableDistributedSampler(size, batch_size=batch, world_size=before, rank=r, seed=3)
        for r in range(before)
    ]
    seen = [i for sampler in firsts for i in consume(sampler, stop_after)]
    resumed = [
        ResumableDistributedSampler(size, batch_size=batch, world_size=after, rank=r, seed=3)
        for r in range(after)
    ]
    for sampler in resumed:
        sampler.load_state_dict(firsts[0].state_dict(), elastic=True)
    rest = [
        i
        for sampler in resumed
        for i in consume(sampler, sampler.batches_per_epoch - sampler.batches_done)
    ]
    # The epoch is covered (no sample skipped); fewer than one global batch is seen twice.
    order = firsts[0]._order().tolist()  # the epoch's order, the same for any world size
    usable = resumed[0].batches_per_epoch * batch * after
    assert set(seen) == set(order[: len(seen)])  # the old gang consumed a prefix of it
    assert set(rest) <= set(order[:usable])  # nothing from outside the new shape's epoch
    assert set(rest) >= set(order[len(seen) : usable])  # nothing skipped
    assert len(seen) + len(rest) - len(set(seen) | set(rest)) < batch * after  # few repeats


def test_rng_state_round_trips_through_weights_only_load(tmp_path: object) -> None:
    import io

    seed_everything(11)
    saved = rng_state()
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    seed_everything(99)
    set_rng_state(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1]) and expected[2] == again[2]


@pytest.mark.processes
@pytest.mark.parametrize("compiler_loaded", [False, True])
def test_seeding_makes_torch_and_a_later_compile_deterministic_without_loading_the_compiler(
    compiler_loaded: bool,
) -> None:
    """In a fresh interpreter, as in a gang worker: loading Inductor only to set its flag
    cost every worker 2 s of its start."""
    code = (
        "import sys, torch\n"
        + ("import torch._inductor.config\n" if compiler_loaded else "")
        + "from tideflow.runtime import seed_everything\n"
        "seed_everything(1)\n"
        "print(torch.are_deterministic_algorithms_enabled(),"
        " torch.is_deterministic_algorithms_warn_only_enabled(),"
        " 'torch._inductor' in sys.modules)\n"
        "import torch._inductor.config as inductor\n"
        "print(inductor.deterministic)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", str(compiler_loaded), "True"]


@pytest.mark.parametrize(
    ("losses", "message"),
    [
        ([1.0, 0.9, math.nan], "loss is nan at step 3"),
        ([1.0, math.inf], "loss is inf at step 2"),
        ([1.0, 0.9, 0.8, 0.85, 0.8, 0.7, 50.0], "loss exploded at step 7: 50 is more than 10x"),
    ],
)
def test_health_guard_stops_divergence(losses: list[float], message: str) -> None:
    guard = HealthGuard(explode_factor=10, warmup=5)
    with pytest.raises(TrainingDiverged, match=message):
        for step, loss in enumerate(losses, start=1):
            guard.check_loss(step, loss)


def test_health_guard_tolerates_noise_and_stops_a_stall() -> None:
    guard = HealthGuard(patience_evals=3, min_delta=0.01, mode="max")
    for step, loss in enumerate([1.0, 1.3, 0.8, 1.1, 0.9, 1.2, 2.5], start=1):
        guard.check_loss(step, loss)  # 2.5 is noisy, not 10x the median
    guard.check_eval(10, 0.90)
    guard.check_eval(20, 0.95)
    guard.check_eval(30, 0.955)
    guard.check_eval(40, 0.951)
    with pytest.raises(TrainingStalled, match=r"3 evaluations without beating 0\.95"):
        guard.check_eval(50, 0.952)


def test_health_guard_catches_a_huge_learning_rate_within_a_few_steps() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    guard = HealthGuard(explode_factor=10, warmup=5)
    for step in range(1, 11):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        guard.check_loss(step, loss.item())
    for group in optimizer.param_groups:
        group["lr"] = 50.0  # the bad learning rate arrives at step 11
    with pytest.raises(TrainingDiverged) as caught:
        for step in range(11, 30):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            guard.check_loss(step, loss.item())
    stopped_at = int(str(caught.value).split("step ")[1].split(":")[0].split()[0])
    assert stopped_at <= 14


def test_mixed_precision_is_off_on_cpu() -> None:
    precision = MixedPrecision(torch.device("cpu"))
    assert not precision.enabled and not precision.scaler.is_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mixed_precision_uses_bf16_or_scaled_fp16_on_gpu() -> None:
    precision = MixedPrecision(torch.device("cuda"))
    assert precision.dtype in (torch.bfloat16, torch.float16)
    assert precision.scaler.is_enabled() == (precision.dtype == torch.float16)


def test_a_checkpoint_of_another_gang_size_resumes_only_an_elastic_gang(tmp_path: Path) -> None:
    """Written by two ranks: a one-rank gang is refused unless elastic (TIDEFLOW_MIN_WORKERS
    set); elastic, it resumes rank 0's state, and a third rank, which has no shard, starts
    from an empty state of its own."""
    manager = CheckpointManager(tmp_path.as_uri())

    def rank(number: int, world_size: int) -> AsyncCheckpointer:
        dist = DistInfo(number, world_size, number, torch.device("cpu"), None, False)
        return AsyncCheckpointer(manager, dist)

    for number in (1, 0):  # as a gang saves: rank 1 first, rank 0 commits
        state = {"model": {"w": torch.ones(2)}}
        rank(number, 2).save(7, state, rank_state={"rng": torch.tensor([number])}, block=True)
    with pytest.raises(RuntimeError, match="step 7 was written by 2 ranks, this gang has 1"):
        rank(0, 1).load_latest()
    resumed = rank(0, 1).load_latest(elastic=True)
    assert resumed is not None
    step, shared, mine = resumed
    assert step == 7 and torch.equal(shared["model"]["w"], torch.ones(2))
    assert torch.equal(mine["rng"], torch.tensor([0]))
    third = rank(2, 3).load_latest(elastic=True)
    assert third is not None and third[2] == {}


def test_a_gang_is_elastic_exactly_when_it_has_a_fewest_workers() -> None:
    fixed = EnvConfig(None, None, None, 3, None, "cpu", False, 0)
    assert not fixed.elastic and replace(fixed, min_workers=1).elastic
