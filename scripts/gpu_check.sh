#!/usr/bin/env bash
# Run ON a lent GPU machine (the device tool's `run`, with carry [".whl"]; see ../shared/hooks/gpu/README.md):
# installs the carried wheels and Trine without deps, then runs every gpu-marked test (unit and the CUDA
# main job) and benchmarks/gpu.py, writing what it saw under $OUT. Results go into benchmarks/RESULTS.md.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PWD/.gpu-site" .whl/*.whl || exit 3
export PYTHONPATH="$PWD/.gpu-site" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 4
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
timeout "${GPU_TEST_SECONDS:-260}" python3 -m pytest -m gpu -q -rA -p no:cacheprovider --durations=10 2>&1 | tee "$OUT/pytest_gpu.txt"
timeout "${GPU_BENCH_SECONDS:-120}" python3 benchmarks/gpu.py 2>&1 | tee "$OUT/bench_gpu.txt"
