"""Model FLOP utilisation of a training step under tideflow's mixed precision, on one GPU.

    python bench/gpu_mfu.py [--width 4096] [--blocks 8] [--tokens 8192] [--steps 20]

The model is a stack of transformer-style MLP blocks (Linear d->4d, GELU,
Linear 4d->d, residual), so nearly all of its work is matrix products whose
FLOPs are known exactly: a training step costs 6 x parameters x tokens
(forward 2, backward 4). The same model and batch run twice in one process:
the baseline in plain fp32 (TF32 off, PyTorch's default), then under
``tideflow.runtime.MixedPrecision`` (bf16 autocast on GPUs that support it).
Printed: step time, achieved TFLOP/s, MFU against the GPU's dense bf16 peak,
and the bf16/fp32 speed-up. Exits 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn

from tideflow.runtime import MixedPrecision

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, in FLOP/s.
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362.05e12}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def peak_for(name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def measure(model: nn.Module, x: torch.Tensor, precision: MixedPrecision, steps: int) -> float:
    """Median seconds per training step (forward, backward, optimizer) after warm-up."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    times = []
    for index in range(steps + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with precision.autocast():
            loss = model(x).float().pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        precision.backward(loss)
        precision.step(optimizer)
        torch.cuda.synchronize()
        if index >= 3:  # the first steps pay for kernel selection and allocation
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_mfu: no CUDA device here", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(args.width) for _ in range(args.blocks))).to(device)
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    x = torch.randn(args.tokens, args.width, device=device)
    flops_per_step = 6 * matmul_params * args.tokens
    fp32 = measure(model, x, MixedPrecision(device, enabled=False), args.steps)
    mixed_precision = MixedPrecision(device)
    mixed = measure(model, x, mixed_precision, args.steps)
    peak = peak_for(name)
    result = {
        "device": name,
        "torch": torch.__version__,
        "width": args.width,
        "blocks": args.blocks,
        "tokens_per_step": args.tokens,
        "matmul_params": matmul_params,
        "fp32_step_s": round(fp32, 5),
        "fp32_tflops": round(flops_per_step / fp32 / 1e12, 1),
        "mixed_dtype": str(mixed_precision.dtype).removeprefix("torch."),
        "mixed_step_s": round(mixed, 5),
        "mixed_tflops": round(flops_per_step / mixed / 1e12, 1),
        "speedup_mixed_vs_fp32": round(fp32 / mixed, 2),
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "mfu_mixed": round(flops_per_step / mixed / peak, 3) if peak else None,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
