#!/usr/bin/env bash
# The GPU checks of pinned checkpoint staging, in one call, on a machine with a CUDA GPU:
#
#     bash bench/gpu_staging.sh                # 2 GiB state, 3 saves per figure
#     SIZE_MB=512 REPEAT=2 bash bench/gpu_staging.sh
#
# Runs the GPU tests of tests/checkpoints/test_pinned_staging.py (they skip without CUDA), then
# bench/gpu_checkpoint_staging.py (pageable vs pinned staging in one run), each under a
# timeout, and prints everything. Exits non-zero if either failed.
set -u
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo no-git) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "available", torch.cuda.is_available())'

echo "== GPU tests: timeout ${TEST_TIMEOUT:-240}s"
timeout "${TEST_TIMEOUT:-240}" "$PYTHON" -m pytest tests/checkpoints/test_pinned_staging.py -q -rs \
    -p no:cacheprovider
tests_rc=$?

echo "== benchmark: timeout ${BENCH_TIMEOUT:-360}s"
timeout "${BENCH_TIMEOUT:-360}" "$PYTHON" bench/gpu_checkpoint_staging.py \
    --size-mb "${SIZE_MB:-2048}" --repeat "${REPEAT:-3}" --json
bench_rc=$?

echo "== tests rc=$tests_rc benchmark rc=$bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
