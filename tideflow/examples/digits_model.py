"""The digits example's model and data, and the entry points over its checkpoints:
``evaluate`` (the evaluation step) and ``log_model`` (the promotion builder).

The pipeline names them as ``tideflow.examples.digits_train:evaluate`` and
``:log_model``; that module, the gang's training script, imports them from here.
"""

from __future__ import annotations

import io
import sys
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from tideflow import settings_registry as registry
from tideflow.checkpoint import CheckpointManager, Manifest
from tideflow.storage import open_store


def load_split(uri: str) -> tuple[torch.Tensor, torch.Tensor]:
    base, _, name = uri.rpartition("/")
    data = open_store(base).get_bytes(name)
    with np.load(io.BytesIO(data)) as arrays:
        return torch.from_numpy(arrays["x"]).float(), torch.from_numpy(arrays["y"]).long()


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = int((model(x).argmax(dim=1) == y).sum().item())
    model.train()
    return correct / len(y)


def model_from_checkpoint(manager: CheckpointManager, manifest: Manifest) -> DigitsMLP:
    """The checkpoint's model on the CPU, its hidden size read from its weights."""
    state = torch.load(
        io.BytesIO(manager.read_shard(manifest, "model.pt")), map_location="cpu", weights_only=True
    )
    weights = state["model"]
    model = DigitsMLP(int(weights["layers.0.weight"].shape[0]))
    model.load_state_dict(weights)
    return model


def evaluate(
    ctx: Any, validation: str, checkpoint_store: str, checkpoint_step: int, checkpoint: str = ""
) -> dict[str, float]:
    """Evaluation entry point: the checkpoint's accuracy and loss on the validation split.

    Loads exactly the checkpoint the training step reported, verifying every
    shard against the manifest's SHA-256 before use, on the device the
    evaluation step was given (``TIDEFLOW_DEVICE_CLASS``).
    """

    from tideflow.runtime.distributed import device_for_class

    manager = CheckpointManager(checkpoint_store)
    manifest = next((m for m in manager.committed() if m.step == int(checkpoint_step)), None)
    if manifest is None:
        raise RuntimeError(
            f"no committed checkpoint at step {checkpoint_step} in {checkpoint_store}"
        )
    problems = manager.verify(manifest)
    if problems:
        raise RuntimeError(f"checkpoint step {manifest.step} failed verification: {problems}")
    model = model_from_checkpoint(manager, manifest)
    device_class = registry.text("TIDEFLOW_DEVICE_CLASS")
    device, emulated = device_for_class(device_class)
    if emulated or registry.flag("TIDEFLOW_EMULATED"):
        device = torch.device("cpu")
        print(f"evaluating emulated on the CPU (asked for {device_class})", flush=True)
    model.to(device).eval()
    x_val, y_val = load_split(validation)
    with torch.no_grad():
        logits = model(x_val.to(device))
        loss = float(F.cross_entropy(logits, y_val.to(device)).item())
        acc = float((logits.argmax(dim=1) == y_val.to(device)).float().mean().item())
    print(
        f"checkpoint step {manifest.step} ({manifest.checksum[:12]}): accuracy {acc:.4f}, "
        f"loss {loss:.4f} on {device}",
        flush=True,
    )
    return {"accuracy": acc, "loss": loss}


def log_model(
    ctx: Any,
    *,
    checkpoint_store: str,
    checkpoint_step: int,
    validation: str,
    run_id: str,
    checkpoint: str = "",
) -> dict[str, str]:
    """Promotion builder: log the checkpoint as an MLflow pytorch model into ``run_id``.

    The input example (five validation images) gives the model its signature,
    so ``mlflow.pyfunc.load_model("models:/NAME@champion").predict(x)`` works.
    """
    import mlflow

    pytorch_flavor = mlflow_pytorch()
    manager = CheckpointManager(checkpoint_store)
    manifest = next((m for m in manager.committed() if m.step == int(checkpoint_step)), None)
    if manifest is None:
        raise RuntimeError(f"no committed checkpoint at step {checkpoint_step}")
    model = model_from_checkpoint(manager, manifest)
    model.eval()
    x_val, _ = load_split(validation)
    with mlflow.start_run(run_id=run_id):
        info = pytorch_flavor.log_model(
            model,
            name="model",
            input_example=x_val[:5].numpy(),
            # Stated, not inferred: MLflow's inference imports the model in a subprocess
            # (16 s per promotion) and lists whatever that import loaded.
            pip_requirements=pytorch_flavor.get_default_pip_requirements(),
        )
    print(f"logged checkpoint step {manifest.step} as {info.model_uri}", flush=True)
    return {"model_uri": str(info.model_uri)}


LIGHTNING = ("lightning", "pytorch_lightning")


def mlflow_pytorch() -> ModuleType:
    """``mlflow.pytorch``, imported without Lightning where Lightning is installed but
    not yet loaded. MLflow imports Lightning on import only to offer its autolog
    callback, which logging a model never uses; that import (Lightning, torchmetrics,
    transformers) takes about 10 s of a promotion. MLflow skips the callback when the
    import fails, and imports Lightning itself when Lightning's autolog is asked for."""
    hidden = [name for name in LIGHTNING if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # an import of it fails
    try:
        import mlflow.pytorch
    finally:
        for name in hidden:
            if sys.modules.get(name, "") is None:
                del sys.modules[name]
    return mlflow.pytorch
