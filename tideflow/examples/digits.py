"""The digits example: scikit-learn's bundled 8x8 handwritten digits (1,797 images).

Small enough to train in a minute on a laptop CPU, real enough to show every
step of a pipeline. No download: the dataset ships inside scikit-learn.
"""

from __future__ import annotations

import io
from typing import Any

from tideflow.steps import StepContext


def _npz(**arrays: Any) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def prepare(ctx: StepContext, validation_fraction: float = 0.2, seed: int = 42) -> dict[str, str]:
    """Stratified train/validation split, pixels scaled to [0, 1], written to the store."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    features = (digits.data / 16.0).astype("float32")
    labels = digits.target.astype("int64")
    x_train, x_val, y_train, y_val = train_test_split(
        features,
        labels,
        test_size=float(validation_fraction),
        random_state=int(seed),
        stratify=labels,
    )
    store = ctx.store()
    outputs = {
        "train": store.put_bytes(ctx.artifact_key("train.npz"), _npz(x=x_train, y=y_train)),
        "validation": store.put_bytes(ctx.artifact_key("validation.npz"), _npz(x=x_val, y=y_val)),
    }
    print(
        f"digits: {len(y_train)} train and {len(y_val)} validation samples "
        f"(validation_fraction={validation_fraction}, seed={seed})"
    )
    for name, uri in outputs.items():
        print(f"digits: wrote {name} -> {uri}")
    return outputs
