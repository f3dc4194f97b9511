# A gang worker image for GPUs: tideflow on a base image that brings a CUDA
# build of torch, which it keeps (tideflow accepts torch >=2.11,<2.14).
#
#   docker build -f deploy/images/gpu-worker.Dockerfile \
#     --build-arg BASE=nvcr.io/nvidia/pytorch:<release>-py3 -t <registry>/tideflow-gpu:0.2.0 .
#
# BASE is any image with Python >= 3.11 and torch 2.11-2.13 built for the node's
# CUDA driver (NGC's PyTorch images, or pytorch/pytorch's *-runtime tags). Build
# from a clean checkout so that no .venv/ or .tideflow/ is copied in.
ARG BASE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
FROM ${BASE}

# The local stack's pins, without torch: the base image's torch is the one to keep.
COPY deploy/local/constraints.txt /tmp/constraints.txt
RUN grep -v '^torch==' /tmp/constraints.txt > /tmp/constraints-gpu.txt

COPY . /opt/tideflow
RUN python -c 'import torch; assert torch.cuda.is_available() or torch.version.cuda, "BASE has no CUDA build of torch"' \
 && pip install --no-cache-dir -c /tmp/constraints-gpu.txt "/opt/tideflow[platform]" \
 && python -c 'import torch, tideflow; print("torch", torch.__version__, "cuda", torch.version.cuda, "tideflow", tideflow.__version__)'

# Your training code goes next to it; point the pipeline's `code.image_path` at it.
# COPY src/ /opt/vision/src/
