#!/usr/bin/env bash
# The CUDA-only checks in one short run, for a machine with a GPU (each step bounded in time):
#   1. the GPU-marked tests (CUDA IPC channel, 1-GPU pipeline);
#   2. the tensor channel on CUDA (latency and throughput vs the pickling queue and a device memcpy);
#   3. a 1-GPU replay of the tiny preset (steady FPS, chunk period, DiT idle fraction).
# Usage: bash benchmarks/device_check.sh [OUT_DIR]    (figures land in OUT_DIR, default runs/device)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/device}"
mkdir -p "$out"
py="${PYTHON:-.venv/bin/python}"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())" \
  | tee -a "$out/gpu.txt"

echo "== GPU tests"
timeout 240 "$py" -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu-tests.txt"

echo "== channel on CUDA"
timeout 120 "$py" -m benchmarks.channel --device cuda --json > "$out/channel-cuda.json" 2> "$out/channel-cuda.log"
tail -n 8 "$out/channel-cuda.log"

echo "== 1-GPU replay (tiny)"
timeout 180 "$py" -m benchmarks.replay --model tiny --placement 1gpu --chunks 24 --quiet \
  --out "$out/replay-1gpu.json" 2>&1 | tail -n 3
"$py" - "$out/replay-1gpu.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
keys = ("steady_compute_fps", "real_time_factor", "dit_idle_fraction", "first_frame_s")
print({k: r.get(k) for k in keys}, "chunk_period_s p50:", r["chunk_period_s"]["p50"])
EOF
