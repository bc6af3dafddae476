#!/usr/bin/env bash
# Records the reference H200 capture (tests/data/) on a GPU host: `vgpumon record` runs while
# bench/h200_workload.py goes through its phases; a live agent stores the same period in SQLite
# and `vgpumon diagnose` reads it back. Usage: bench/h200_capture.sh OUTDIR
set -euo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
nvidia-smi -q -x > "$out/nvidia-smi-q.xml" || true
python3 -m vgpumon record "$out/h200-capture.jsonl.gz" --duration 75s --interval 1 --mask &
rec=$!
python3 -m vgpumon agent --db "sqlite:///$out/live.db" --duration 75s --hostname h200-live &
agent=$!
sleep 2
python3 bench/h200_workload.py "$out/h200-phases.json" 2>&1 | tee "$out/workload.log"
wait $rec $agent
python3 -m vgpumon diagnose h200-live --db "sqlite:///$out/live.db" --json > "$out/live-diagnose.json" || echo "diagnose exit $?"
python3 -m vgpumon diagnose h200-live --db "sqlite:///$out/live.db" || true
