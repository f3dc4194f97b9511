"""Seeds and RNG states: the same seed gives the same run, and resume restores the stream."""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    deterministic_algorithms()


def deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)``, without its import of
    Inductor (the compiler stack: 2 s of every worker's start) to set Inductor's own flag.

    Inductor reads that flag from TORCHINDUCTOR_DETERMINISTIC when first imported, so a
    model compiled later is deterministic too; where it is imported already, torch's own
    call sets it.
    """
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain values, so torch.load(weights_only=True) reads them."""
    numpy_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(numpy_state[1].astype(np.int64)),
        "numpy_pos": int(numpy_state[2]),
        "python": torch.tensor(random.getstate()[1], dtype=torch.int64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    keys = state["numpy"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, int(state["numpy_pos"]), 0, 0.0))
    python = tuple(int(v) for v in state["python"].tolist())
    random.setstate((3, python, None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
