#!/usr/bin/env bash
# Every measurement of docs/benchmarks.md that needs the GPU, in one go: sysfs snapshot, a
# full-field idle capture, a pre-Hopper-path capture under a copy loop, the nvidia-smi
# cross-check, the fast-set cost comparison and the agent's CPU share.
# Usage: bench/h200_suite.sh OUTDIR
set -uo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
echo "== sysfs";      python3 -m vgpumon.testing.sysfs "$out/h200-sysfs.json"
echo "== record idle (full field set)"
python3 -m vgpumon record "$out/h200-idle-full.jsonl.gz" --duration 20s --slow-every 2 --mask
echo "== record pre-Hopper path (--no-gpm) under a copy loop"
python3 -m vgpumon record "$out/h200-nogpm-copy.jsonl.gz" --duration 16s --no-gpm --mask &
rec=$!
sleep 2
python3 -c "
import torch, time
s = torch.empty(2**30, dtype=torch.uint8).pin_memory(); d = torch.empty(2**30, dtype=torch.uint8, device='cuda')
t0 = time.time(); n = 0
while time.time() - t0 < 11: d.copy_(s, non_blocking=True); torch.cuda.synchronize(); n += 1
print(f'copy loop: {n * 2**30 / (time.time() - t0) / 1e9:.2f} GB/s')"
wait $rec
echo "== cross-check";  python3 bench/crosscheck.py
echo "== fast-set cost"; python3 bench/nvml_cost.py --ticks 2000 --json "$out/nvml_cost.json"
echo "== agent CPU (live, 1 s, SQLite)"
python3 bench/agent_cpu.py --warmup 10 --measure 120 -- --db "sqlite:///$out/cpu.db"
rm -f "$out"/cpu.db*
