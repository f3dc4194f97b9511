"""The Kubernetes names that tideflow's objects and the platform's nodes share.

``compile`` sits below ``kube``, ``broker`` and ``stack`` in the layers, so each of
them reads these names here and none repeats them.
"""

from __future__ import annotations

# The extended resource a node offers per accelerator class (a CPU step asks for none).
DEVICE_RESOURCES = {"gpu": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
# What a queue's quota counts per device class of a cluster file.
QUOTA_RESOURCES = {"cpu": "cpu", **DEVICE_RESOURCES}
# A node without declared labels is found by its model: the label GPU feature discovery
# (or the NPU's device plugin) gives it.
MODEL_LABELS = {"gpu": "nvidia.com/gpu.product", "npu": "accelerator/huawei-npu"}
POOL_LABEL = "tideflow.io/pool"  # the node label naming a node's pool
POOL_TAINT = "tideflow.io/pool"  # the taint key keeping other pools' pods off a node
BROKER_POOL = "training"  # the pool label value of the nodes the broker lends to training
TRAINING_QUEUE = "training"  # the queue the broker moves quota of (its setting's default)
NAMESPACE = "tideflow"  # where gangs and LocalQueues live (its setting's default)
