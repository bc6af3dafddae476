#!/bin/bash
# The fast-set ratio several times in one sitting on a GPU host: bench/nvml_cost.py's interleaved
# comparison (vgpumon and bare nvidia-ml-py tick by tick in turn) N times, then
# bench/fast_set_breakdown.py's alternating rounds. For the spread between runs that one
# bench/h200_footprint.sh run cannot show (docs/benchmarks.md, "Agent footprint").
# Usage: N=6 OUT=DIR bash bench/fast_set_repeat.sh
set -u
OUT=${OUT:-/tmp/vgpumon-fast-set}
N=${N:-6}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
env -u PYTHONDONTWRITEBYTECODE $PY -m compileall -q vgpumon bench > /dev/null
$PY - "$N" <<'PYEOF' 2>&1 | grep -v WARNING | tee "$OUT/interleaved.txt"
import sys
sys.path[:0] = ["bench", "."]
import nvml_cost
print("run  vgpumon ms  bare ms  ratio  (per GPU, median of 2000 ticks each, interleaved)")
for k in range(int(sys.argv[1])):
    ours, bare = nvml_cost.time_interleaved(2000)
    print(f"{k + 1:<4} {ours['median_ms']:>10.3f} {bare['median_ms']:>8.3f} {ours['median_ms'] / bare['median_ms']:>6.2f}", flush=True)
PYEOF
$PY bench/fast_set_breakdown.py --ticks 1000 --rounds 5 2>&1 | grep -v WARNING | tee "$OUT/breakdown.txt"
