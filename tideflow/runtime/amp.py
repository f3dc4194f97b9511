"""Mixed precision: bf16 where the GPU supports it, else fp16 with a dynamic loss scale."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class MixedPrecision:
    def __init__(self, device: torch.device, *, enabled: bool = True) -> None:
        self.device = device
        self.dtype: torch.dtype | None = None
        if enabled and device.type == "cuda":
            self.dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # A loss scaler only for fp16: bf16 has fp32's range and needs none.
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.dtype == torch.float16)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scaler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)
