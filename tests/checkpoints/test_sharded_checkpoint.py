"""FSDP2 state through torch.distributed.checkpoint into tideflow's checkpoint stores.

The training script under test is ``tests/user_code/fsdp2_train.py``, run as
real gloo processes on the CPU, each started with torchrun's variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). A two-worker run saves at
step 4; runs of one and three workers resume from it and must hold exactly
the state it saved.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.user_code.fsdp2_train import build_model
from tideflow.checkpoint import CheckpointError, CheckpointManager, CorruptCheckpointError
from tideflow.checkpoint.manifest import MANIFEST_NAME, step_prefix
from tideflow.runtime.dcp_format import METADATA_SHARD
from tideflow.runtime.dcp_reader import CheckpointStorageReader
from tideflow.runtime.sharded import async_save_sharded, load_sharded, save_sharded

pytestmark = pytest.mark.processes

SCRIPT = Path(__file__).parents[1] / "user_code" / "fsdp2_train.py"
STEP = 4
LAUNCH_TIMEOUT_S = 90.0
FAILURE_GRACE_S = 20.0


@dataclass
class Rank:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch(nproc: int, *args: str | Path, logs: Path) -> list[Rank]:
    """Run the script as ``nproc`` ranks of one gloo group; every rank's exit and output."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        with (
            open(logs / f"rank-{rank}.out", "w") as out,
            open(logs / f"rank-{rank}.err", "w") as err,
        ):
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(SCRIPT), *map(str, args)],
                    env=env,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            )
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
            if any(proc.returncode not in (None, 0) for proc in procs):
                # A rank that died may leave the others waiting in a collective.
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [
        Rank(
            rank,
            proc.returncode,
            (logs / f"rank-{rank}.out").read_text(),
            (logs / f"rank-{rank}.err").read_text(),
        )
        for rank, proc in enumerate(procs)
    ]


def succeeded(ranks: list[Rank]) -> None:
    for rank in ranks:
        assert rank.returncode == 0, f"rank {rank.rank} exited {rank.returncode}:\n{rank.stderr}"


def reports(out: Path, nproc: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(nproc)]


def assert_same_state(saved: Any, loaded: Any, path: str = "") -> None:
    """Every tensor bit for bit, every other value equal."""
    if isinstance(saved, dict):
        assert saved.keys() == loaded.keys(), path
        for key in saved:
            assert_same_state(saved[key], loaded[key], f"{path}/{key}")
    elif isinstance(saved, list | tuple):
        assert len(saved) == len(loaded), path
        for index, (a, b) in enumerate(zip(saved, loaded, strict=True)):
            assert_same_state(a, b, f"{path}/{index}")
    elif isinstance(saved, torch.Tensor):
        assert saved.dtype == loaded.dtype and torch.equal(saved, loaded), path
    else:
        assert saved == loaded, path


@dataclass
class Saved:
    root: Path
    sync_uri: str
    async_uri: str
    reports: list[dict[str, Any]]
    state: dict[str, Any]  # the full model and optimizer state at the save

    def copy(self, target: Path) -> CheckpointManager:
        shutil.copytree(self.root / "sync", target)
        return CheckpointManager(target.as_uri())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """Two workers train 4 steps, save (sync) and save again (async) while training on."""
    root = tmp_path_factory.mktemp("sharded")
    sync_uri, async_uri = (root / "sync").as_uri(), (root / "async").as_uri()
    out = root / "out"
    args = ("--store", sync_uri, "--async-store", async_uri, "--steps", str(STEP), "--out", out)
    succeeded(launch(2, *args, logs=root / "logs"))
    state = torch.load(out / "state.pt", weights_only=True)
    return Saved(root, sync_uri, async_uri, reports(out, 2), state)


def plain_model_state() -> dict[str, Any]:
    """The model's state in one process, no process group: how an evaluation job reads it."""
    return {"model": build_model().state_dict()}


# -- saving ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_two_workers_commit_one_manifest_listing_every_ranks_shards(saved: Saved) -> None:
    manager = CheckpointManager(saved.sync_uri)
    [manifest] = manager.committed()
    assert manifest.step == STEP
    assert manifest.world_size is None  # not the model.pt + rank-R.pt gang layout
    assert manifest.meta["format"] == "torch-dcp" and manifest.meta["world_size"] == 2
    assert manifest.metrics == {"step": float(STEP)}
    names = {record.name for record in manifest.shards}
    assert names == {"__0_0.distcp", "__1_0.distcp", METADATA_SHARD}
    # Every file DCP wrote is a listed shard, and each matches its recorded SHA-256 and size.
    stored = set(manager.store.list(step_prefix(STEP)))
    assert stored == {f"{step_prefix(STEP)}/{name}" for name in names | {MANIFEST_NAME}}
    assert manager.verify(manifest) == []
    # Rank 0 committed it and returned it; rank 1 got None.
    assert [report["manifest"] for report in saved.reports] == [manifest.checksum, None]


@pytest.mark.timeout(60)
def test_a_committed_step_is_never_saved_over(saved: Saved, tmp_path: Path) -> None:
    manager = saved.copy(tmp_path / "ckpt")
    before = manager.load(STEP)
    with pytest.raises(CheckpointError, match="already committed"):
        save_sharded(manager, STEP, plain_model_state())
    after = manager.load(STEP)  # verifies every shard: none was overwritten
    assert after.checksum == before.checksum


# -- resuming ----------------------------------------------------------------------------


def assert_resumed(saved: Saved, out: Path, nproc: int) -> None:
    saved_report = saved.reports[0]
    for report in reports(out, nproc):
        assert report["world_size"] == nproc and report["resumed_from"] == STEP
        # The full model right after the load is the saved one, not the initial one ...
        assert report["loss"] == saved_report["loss"] != report["initial_loss"]
        # ... and so is the optimizer: one more identical full-batch step lands in the same place.
        assert report["loss_after_step"] == pytest.approx(saved_report["loss_after_step"], rel=1e-6)
    assert_same_state(saved.state, torch.load(out / "state.pt", weights_only=True))


@pytest.mark.timeout(120)
def test_resume_on_one_worker_restores_the_saved_state(saved: Saved, tmp_path: Path) -> None:
    """Two workers saved; one resumes. (Three resume in the S3 test below.)"""
    out = tmp_path / "out"
    succeeded(launch(1, "--store", saved.sync_uri, "--resume", "--out", out, logs=tmp_path))
    assert_resumed(saved, out, 1)


@pytest.mark.timeout(180)
def test_s3_save_with_two_workers_resumes_with_three(
    saved: Saved, s3_endpoint: str, tmp_path: Path
) -> None:
    uri = f"s3://tideflow/tests/sharded/{uuid.uuid4().hex}"
    written = tmp_path / "written"
    args = ("--store", uri, "--steps", str(STEP), "--out", written)
    succeeded(launch(2, *args, logs=tmp_path / "save"))
    manifest = CheckpointManager(uri).load(STEP)  # committed, every shard verified
    assert manifest.uri.startswith("s3://") and manifest.meta["world_size"] == 2
    # The S3 run computed what the file-store run did: same script, same data.
    assert_same_state(saved.state, torch.load(written / "state.pt", weights_only=True))
    out = tmp_path / "out"
    succeeded(launch(3, "--store", uri, "--resume", "--out", out, logs=tmp_path / "resume"))
    assert_resumed(saved, out, 3)


# -- async -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_async_save_commits_the_same_checkpoint_as_sync_save(saved: Saved) -> None:
    """The async save was taken at step 4, and training stepped on while it was written."""
    sync = CheckpointManager(saved.sync_uri)
    background = CheckpointManager(saved.async_uri)
    sync_manifest, async_manifest = sync.load(STEP), background.load(STEP)
    assert [report["async_manifest"] for report in saved.reports] == [
        async_manifest.checksum,
        None,
    ]
    assert async_manifest.meta == sync_manifest.meta
    assert async_manifest.metrics == sync_manifest.metrics

    def data_shards(manifest: Any) -> dict[str, tuple[str, int]]:
        return {r.name: (r.sha256, r.size) for r in manifest.shards if r.name != METADATA_SHARD}

    # The tensors and values written are identical, byte for byte ...
    assert data_shards(async_manifest) == data_shards(sync_manifest)
    # ... and so is the metadata, but for the save's own id and location.
    sync_metadata = CheckpointStorageReader(sync, sync_manifest).read_metadata()
    async_metadata = CheckpointStorageReader(background, async_manifest).read_metadata()
    assert async_metadata.state_dict_metadata == sync_metadata.state_dict_metadata
    assert async_metadata.storage_data == sync_metadata.storage_data
    # Control came back before the checkpoint was committed.
    for report in saved.reports:
        assert 0 < report["async_stall_seconds"] <= report["async_seconds"]


@pytest.mark.timeout(60)
def test_each_async_save_holds_the_state_at_its_call(tmp_path: Path) -> None:
    """Saves one after another reuse their staging copies; none sees a later change."""
    manager = CheckpointManager((tmp_path / "ckpt").as_uri())
    model = build_model()
    expected, saves = {}, []
    for step in (1, 2, 3):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(step)  # in place, as an optimizer step changes them
        expected[step] = {key: tensor.clone() for key, tensor in model.state_dict().items()}
        saves.append(async_save_sharded(manager, step, {"model": model.state_dict()}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    manifests = [save.result() for save in saves]
    assert [manifest.step for manifest in manifests if manifest] == [1, 2, 3]
    for step, save in zip((1, 2, 3), saves, strict=True):
        assert save.seconds is not None and 0 < save.stall_seconds <= save.seconds
        state = plain_model_state()
        load_sharded(manager, state, step=step)
        assert_same_state(expected[step], state["model"])


# -- refusing ----------------------------------------------------------------------------


def damage(manager: CheckpointManager, name: str) -> None:
    key = f"{step_prefix(STEP)}/{name}"
    data = bytearray(manager.store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    manager.store.put_bytes(key, bytes(data))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["__1_0.distcp", METADATA_SHARD])
def test_a_shard_damaged_after_commit_is_refused_on_load_naming_it(
    saved: Saved, tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager = saved.copy(tmp_path / "ckpt")
    damage(manager, name)
    state = plain_model_state()
    # Checked up front, and (verify=False) as each shard is read.
    for verify in (True, False):
        with pytest.raises(CorruptCheckpointError, match=rf"shard {name}\b"):
            load_sharded(manager, state, step=STEP, verify=verify)
    # The newest checkpoint is damaged and there is no older one: nothing to resume.
    with caplog.at_level(logging.WARNING, logger="tideflow.checkpoint.manager"):
        assert load_sharded(manager, state) is None
    assert f"skipping checkpoint step {STEP}: shard {name}" in caplog.text


@pytest.mark.timeout(120)
def test_every_worker_refuses_a_damaged_shard_even_one_it_does_not_read(
    saved: Saved, tmp_path: Path
) -> None:
    """Rank 0's own shard, found damaged as it is read; the refusal reaches every rank."""
    manager = saved.copy(tmp_path / "ckpt")
    damage(manager, "__0_0.distcp")
    args = ("--store", manager.uri, "--resume", "--no-verify", "--out", tmp_path / "out")
    ranks = launch(2, *args, logs=tmp_path / "logs")
    for rank in ranks:
        assert rank.returncode != 0
        assert "CorruptCheckpointError: loading checkpoint step 4: rank " in rank.stderr
        assert "shard __0_0.distcp is damaged" in rank.stderr
    assert not (tmp_path / "out" / "state.pt").exists()


@pytest.mark.timeout(60)
def test_shards_without_a_manifest_are_never_loaded(saved: Saved, tmp_path: Path) -> None:
    """Step 6 is left as a save that died after its last shard, before its manifest."""
    manager = saved.copy(tmp_path / "ckpt")
    newer = plain_model_state()
    for tensor in newer["model"].values():
        tensor.fill_(7.0)
    save_sharded(manager, 6, newer)
    manager.store.delete(f"{step_prefix(6)}/{MANIFEST_NAME}")
    assert f"{step_prefix(6)}/{METADATA_SHARD}" in manager.store.list(step_prefix(6))

    state = plain_model_state()
    manifest = load_sharded(manager, state)
    assert manifest is not None and manifest.step == STEP
    assert_same_state(saved.state["model"], state["model"])
    with pytest.raises(CheckpointError, match="no committed checkpoint at step 6"):
        load_sharded(manager, plain_model_state(), step=6)


@pytest.mark.timeout(60)
def test_checkpoints_that_are_not_dcp_ones_are_skipped_with_a_warning(
    saved: Saved, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = saved.copy(tmp_path / "ckpt")
    manager.save(8, {"model.pt": b"a torch.save'd model"})
    state = plain_model_state()
    with caplog.at_level(logging.WARNING, logger="tideflow.checkpoint.manager"):
        manifest = load_sharded(manager, state)
    assert manifest is not None and manifest.step == STEP
    assert "skipping checkpoint step 8: it is not a torch-dcp checkpoint" in caplog.text
    assert_same_state(saved.state["model"], state["model"])
    with pytest.raises(CheckpointError, match="step 8: it is not a torch-dcp checkpoint"):
        load_sharded(manager, plain_model_state(), step=8)
