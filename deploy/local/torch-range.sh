#!/usr/bin/env bash
# Run the runtime's tests with the lowest torch tideflow accepts (the `platform`
# extra's lower bound), on top of .venv: a second venv that holds only that torch
# and reads every other package from .venv. PyPI's wheel is the CUDA build (about
# 4.5 GB installed; it runs on the CPU); pip's cache keeps it for the next run.
set -euo pipefail
cd "$(dirname "$0")/../.."
TORCH=${TORCH:-2.11.0}
VENV=.venv-torch-$TORCH
PY=${PYTHON:-python3}
site() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "torch==$TORCH"
  # after its own site-packages: .venv's packages, then this checkout (tideflow)
  echo "$(site .venv/bin/python)" > "$(site "$VENV/bin/python")/zz_tideflow_venv.pth"
  echo "$PWD" > "$(site "$VENV/bin/python")/zz_tideflow_checkout.pth"
fi
# the servers the tests start (S3, MLflow) are found next to the interpreter
for server in weed mlflow; do ln -sf "$PWD/.venv/bin/$server" "$VENV/bin/$server"; done
"$VENV/bin/python" -c 'import torch, tideflow; print("torch", torch.__version__, "tideflow", tideflow.__version__)'
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q \
  tests/checkpoints/test_runtime.py tests/checkpoints/test_runtime_distributed.py tests/checkpoints/test_checkpoints_api.py \
  tests/checkpoints/test_sharded_checkpoint.py tests/gangs/test_gang_commit.py tests/checkpoints/test_checkpoint.py \
  tests/gangs/test_hf_integration.py tests/gangs/test_lightning_integration.py \
  tests/checkpoints/test_pinned_staging.py "$@"
