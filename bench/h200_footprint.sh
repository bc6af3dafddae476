#!/bin/bash
# Issue "agent footprint": every comparison in one run on a GPU host (docs/benchmarks.md,
# "Agent footprint"). Writes its reports into the folder the caller names:
#
#   OUT=DIR bash bench/h200_footprint.sh
#
# No default folder, so that a run is never mistaken for another: the newest fresh-machine run is
# kept under the one stable name bench/results/footprint-h200/ (copy DIR's files there; the runs
# before it are in git history).
#
# Python files are compiled first (.pyc), as `pip install` leaves them on a user's host: without
# them every start compiles the sources again, and the compiler's memory stays in the process's
# resident set (+2 to +9 MB measured on the H200).
set -u
OUT=${OUT:?set OUT to the folder for the reports of this run (kept copy: bench/results/footprint-h200/)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
env -u PYTHONDONTWRITEBYTECODE $PY -m compileall -q vgpumon bench > /dev/null
# ... and every module the agent imports from site-packages (the GPU host ships its packages, and
# pip --no-compile leaves carried wheels, without .pyc): a 15-s live run names them all.
rm -rf /tmp/vgpumon-compile.db* /tmp/vgpumon-compile-spool
$PY bench/compile_imported.py -- $PY -m vgpumon agent --duration 15s --listen 127.0.0.1:19409 \
    --db sqlite:////tmp/vgpumon-compile.db --spool /tmp/vgpumon-compile-spool | tee "$OUT/compiled.txt"
nvidia-smi --query-gpu=name,driver_version,count --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | sed 's/^/cores: /' | tee -a "$OUT/gpu.txt"
$PY -c "import pynvml, sqlalchemy, aiohttp, sys; print('python', sys.version.split()[0], 'sqlalchemy', sqlalchemy.__version__, 'aiohttp', aiohttp.__version__)" | tee -a "$OUT/gpu.txt"
echo "== fast path answers = nvidia-ml-py's"; $PY bench/fast_equivalence.py > "$OUT/fast_equivalence.txt" 2>&1; tail -1 "$OUT/fast_equivalence.txt"; grep DIFFERENT "$OUT/fast_equivalence.txt"
# AGENT_ONLY=1: the fast set against bare nvidia-ml-py and the whole agent only (about 4 minutes;
# the side-by-side with nvidia-smi, nvitop and gpustat is the longest part)
if [ -z "${AGENT_ONLY:-}" ]; then
echo "== blocking and slow-set calls: CPU against wall"; $PY bench/nvml_call_cpu.py 2>&1 | grep -v WARNING | tee "$OUT/call_cpu.txt"
fi
echo "== fast set: vgpumon, its calls alone, bare nvidia-ml-py (alternating rounds)"
$PY bench/fast_set_breakdown.py --ticks 1000 --rounds 3 2>&1 | grep -v WARNING | tee "$OUT/breakdown.txt"
if [ -z "${AGENT_ONLY:-}" ]; then
echo "== fast-set sample per GPU, side by side (nvidia-smi, nvitop; gpustat in its own process, last)"
$PY bench/nvml_cost.py --ticks 2000 --runs 50 --json "$OUT/nvml_cost.json" 2>&1 | grep -v WARNING | tee "$OUT/nvml_cost.txt"
fi
echo "== whole agent over 120 s after 30 s, /metrics scraped every 15 s, beside the bare loop and the import-and-init floors"
rm -rf /tmp/vgpumon-fp.db* /tmp/vgpumon-fp-spool
$PY -m vgpumon db upgrade --db sqlite:////tmp/vgpumon-fp.db
$PY bench/agent_footprint.py --warmup 30 --measure 120 --every 5 --marks 35,60,120,150 --bare --floor --json "$OUT/footprint.json" \
    -- --db sqlite:////tmp/vgpumon-fp.db --spool /tmp/vgpumon-fp-spool 2>&1 | grep -v "WARNING\|INFO" | tee "$OUT/footprint.txt"
