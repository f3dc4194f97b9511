"""The node label value of each GPU model a cluster file or pipeline names briefly."""

from __future__ import annotations

from collections.abc import Mapping

from tideflow import settings_registry as registry
from tideflow.config import ConfigError

# A cluster file or pipeline names a model briefly ("H100"); GPU feature discovery labels
# a node with the product name. Flavors and gang pods both select by it, so they map
# the model the same way (TIDEFLOW_K8S_DEVICE_MODELS replaces this table).
GPU_PRODUCTS = (("H100", "NVIDIA-H100-80GB-HBM3"), ("A100", "NVIDIA-A100-SXM4-80GB"))
DEVICE_MODELS_VARIABLE = "TIDEFLOW_K8S_DEVICE_MODELS"


def gpu_products(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """Model -> node label value, from TIDEFLOW_K8S_DEVICE_MODELS or the default table."""
    raw = registry.raw(DEVICE_MODELS_VARIABLE, environ)
    if not raw:
        return GPU_PRODUCTS
    pairs = [item.partition("=") for item in raw.split(",") if item.strip()]
    if any(not name.strip() or not sep or not value.strip() for name, sep, value in pairs):
        raise ConfigError(
            f"{DEVICE_MODELS_VARIABLE}={raw!r}: accepted: MODEL=NODE_LABEL_VALUE pairs "
            "separated by commas (e.g. H100=NVIDIA-H100-80GB-HBM3)"
        )
    return tuple((name.strip(), value.strip()) for name, _, value in pairs)
