#!/usr/bin/env bash
# --decode hw on one GPU (A100/H100/H200), in one go, ~6 minutes: install nvImageCodec + nvJPEG
# from local wheels (no network needed), print versions, self-test the hardware decoder, run the
# decoder's CUDA and CPU tests, generate the bench's JPEGs, then bench_extract on ResNet-50
# (naive, cpu, gpu, mixed, hw, hw-mixed, hw:2/3, hw-mixed+compile; pixel checks of gpu and hw against cpu;
# --profile: each decoder alone, the model alone, decoder beside the model) while
# `nvidia-smi dmon` records SM and JPG-engine utilisation.  Every step runs even if an earlier
# one failed; results go to $OUT (default ./gpu_decode_check) as small text/json files.
#
#   WHEELS=.whl OUT=/tmp/out bash bench/gpu_decode_check.sh
#
# WHEELS: a folder with nvidia_nvimgcodec_cu13-*.whl + nvidia_nvjpeg-13*.whl (CUDA 13 driver)
# and/or nvidia_nvimgcodec_cu12-*.whl + nvidia_nvjpeg_cu12-*.whl (CUDA 12 driver); skipped when
# nvImageCodec already imports.  ROWS (default 10240), VARIANTS and PYTHON can be overridden.
set -x
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_decode_check}
WHEELS=${WHEELS:-.whl}
PY=${PYTHON:-python3}
ROWS=${ROWS:-10240}
DATA=${DATA:-/tmp/jpegs_decode_check}
VARIANTS=${VARIANTS:-naive,cpu,gpu,mixed,hw,hw-mixed,hw:2/3,hw-mixed+compile}
mkdir -p "$OUT"
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, go on
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$OUT/steps.txt"
}

# 1. versions and the driver's CUDA version (picks the cu13 or cu12 wheels)
{
    date -u; nvidia-smi; nvidia-smi -q | grep -i -E "product name|driver version|cuda version|jpg|jpeg"
    $PY -c "import torch, torchvision, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'gpu', torch.cuda.get_device_name(0))"
    nproc
} > "$OUT/versions.txt" 2>&1
DRIVER_CUDA=$(nvidia-smi | grep -o "CUDA Version: [0-9]*" | grep -o "[0-9]*$")
if [ "${DRIVER_CUDA:-0}" -ge 13 ]; then CU=cu13; NVJPEG="nvidia_nvjpeg-13*.whl"; else CU=cu12; NVJPEG="nvidia_nvjpeg_cu12-*.whl"; fi
echo "driver CUDA ${DRIVER_CUDA:-?}: $CU wheels" | tee -a "$OUT/versions.txt"

# 2. install (local wheels only), then the versions nvImageCodec reports
if ! $PY -c "import nvidia.nvimgcodec" 2>/dev/null; then
    step install 120 $PY -m pip install --no-index --no-deps $WHEELS/nvidia_nvimgcodec_${CU}-*.whl $WHEELS/$NVJPEG
fi
$PY -c "import h5py, click, tqdm, xxhash, timm, sklearn, pytest" 2>/dev/null || \
    step install_deps 180 $PY -m pip install --no-index --find-links "$WHEELS" h5py click tqdm xxhash scikit-learn timm pytest
step nvimgcodec_version 60 $PY -c "import nvidia.nvimgcodec as n; print('nvimgcodec', n.__version__, 'cuda', n.__cuda_version__)"

# 3. the hardware decoder's self-test (a clear refusal here says why --decode hw cannot run)
step hw_selftest 60 $PY -c "import torch; from pipeline.data.hwdecode import HardwareJpeg; HardwareJpeg(torch.device('cuda')); print('HW decoder OK on', torch.cuda.get_device_name(0))"

# 4. the decoder's tests: CUDA (race, buffer lifetime, pixels, whole extract) and CPU ones
step pytest_decode 150 $PY -m pytest -q -rs tests/test_decode_cuda.py tests/test_hwdecode.py

# 5. the bench's JPEGs (ImageNet-shaped, ~100 KB, mostly 500x375)
[ -d "$DATA/val" ] || step make_jpegs 150 $PY bench/make_jpegs.py --out "$DATA" --n-val "$ROWS" --n-train 0

# 6. the benchmark, with SM / JPG-engine utilisation sampled once a second meanwhile
nvidia-smi dmon -s u -d 1 > "$OUT/dmon.txt" 2>&1 &
DMON=$!
step bench_extract 400 $PY bench/bench_extract.py --data "$DATA" --models resnet50 \
    --variants "$VARIANTS" --json "$OUT/bench_extract.json" --profile --work /tmp/bench_extract_hw
kill "$DMON" 2>/dev/null
grep -E "^  |BENCH_EXTRACT_SUMMARY|Error|error" "$OUT/bench_extract.log" > "$OUT/bench_summary.txt"
tail -n 5 "$OUT"/*.log > "$OUT/tails.txt" 2>&1
cat "$OUT/steps.txt" "$OUT/bench_summary.txt"
