#!/usr/bin/env bash
# The whole GPU check in one or two commands on a lent GPU machine (no network there).
#
#   bash benchmarks/gpu_suite.sh tests      # pytest -m gpu, then the whole non-slow suite with device "auto" = CUDA
#   bash benchmarks/gpu_suite.sh fashion    # bench_kernel.py's Fashion-MNIST rows on the GPU
#   bash benchmarks/gpu_suite.sh large      # the 5M-row kernel run, BMGD out of core, parallel with a GPU worker
#
# Fashion-MNIST is read from $SKGPU_FASHION_MNIST (default .data/fashion-mnist, copied
# from /usr/share/datasets/fashion-mnist and carried with the call). Logs and tables go
# to $OUT (default /tmp/gpu_suite). The machine's own python3 (with torch, scikit-learn,
# scipy, joblib, pytest, pytest-xdist) is used as it is: nothing is installed. Three
# xdist workers: a run with eight lost the machine once (cause unknown).
set -u
OUT=${OUT:-/tmp/gpu_suite}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENBLAS_CORETYPE=Haswell PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SKGPU_FASHION_MNIST=${SKGPU_FASHION_MNIST:-$PWD/.data/fashion-mnist}
PY=${PY:-python3}

header() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/device.txt"
    $PY -c "import torch, sklearn, numpy; print('torch', torch.__version__, 'sklearn', sklearn.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/device.txt"
}

part_tests() {
    timeout 120 $PY -m pytest -p no:cacheprovider -m gpu -rA -q tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
    timeout 240 $PY -m pytest -p no:cacheprovider -m "not slow and not gpu" -n 3 -q -rfE --durations=15 tests 2>&1 \
        | tee "$OUT/pytest_all_cuda.log" | tail -60
}

part_fashion() {
    timeout 200 $PY benchmarks/bench_kernel.py --parts fashion --write "$OUT/RESULTS_gpu.md" 2>&1 | tee "$OUT/bench_fashion.log" | tail -40
}

part_large() {
    timeout 200 $PY benchmarks/bench_kernel.py --parts large --write "$OUT/RESULTS_gpu.md" 2>&1 | tee "$OUT/bench_large.log" | tail -25
    timeout 200 $PY benchmarks/bench_bmgd.py --parts a --write "$OUT/RESULTS_gpu.md" 2>&1 | tee "$OUT/bench_bmgd.log" | tail -25
    timeout 300 $PY benchmarks/bench_parallel.py --rows 200000 --repeats 1 --write "$OUT/RESULTS_gpu.md" 2>&1 | tee "$OUT/bench_parallel.log" | tail -25
}

header
for part in "$@"; do "part_$part"; done
