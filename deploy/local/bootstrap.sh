#!/usr/bin/env bash
# Create .venv and install tideflow with every dependency pinned by
# deploy/local/constraints.txt. Safe to run again: pip skips what is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "tideflow needs Python >= 3.11; $("$PYTHON" --version 2>&1) found. Set PYTHON=..." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned (2.13.0). PyPI's Linux wheel is the CUDA build, several GB, which
# also runs on a machine without a GPU; pip's cache keeps it. hf and lightning: the
# training-framework integrations (tideflow.integrations), installed so their tests
# run rather than skip.
# docs: mkdocs-material, so `make docs` builds the site.
.venv/bin/python -m pip install --quiet -c deploy/local/constraints.txt \
  -e '.[platform,dev,hf,lightning,docs]'
echo "tideflow installed in .venv ($(.venv/bin/python -c 'import tideflow; print(tideflow.__version__)'))"
