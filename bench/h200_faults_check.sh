#!/usr/bin/env bash
# The live agent on a GPU host after the collector-hardening work: a short run with a torch
# process holding GPU memory stores ticks, the process with its owner and the PCIe topology;
# cached "not supported" answers are re-probed (seen in the log, --reprobe-every 10); no GPU is
# marked wedged. Then the fast-set cost, side by side with the bare per-call floor.
# Usage: bench/h200_faults_check.sh OUTDIR
set -uo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
echo "== live agent, 30 s, a torch process holding 2 GiB"
python3 -c "import torch, time; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); time.sleep(45)" &
holder=$!
sleep 8
python3 -m vgpumon --log-level info agent --duration 30s --reprobe-every 10 --no-rules --listen off --db "sqlite:///$out/live.db" 2> "$out/agent.log"
echo "agent exit $?"
kill $holder 2>/dev/null
grep -E "re-probing|wedged|ERROR|Traceback" "$out/agent.log" | head -20
tail -3 "$out/agent.log"
python3 -m vgpumon diagnose localhost --db "sqlite:///$out/live.db" > "$out/diagnose.txt"
echo "diagnose exit $?"
head -30 "$out/diagnose.txt"
python3 - "$out/live.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for q in ("SELECT count(*), sum(up), count(memory_temperature_celsius), max(memory_temperature_celsius) FROM gpu_samples",
          "SELECT count(*) FROM host_samples",
          "SELECT pid, name, username, resolved, substr(cmdline, 1, 60) FROM processes",
          "SELECT count(*), max(used_gpu_memory_bytes), max(rss_bytes) FROM gpu_process_samples",
          "SELECT bdf, kind, parent_bdf, link_gen_max, link_width_max FROM pcie_links",
          "SELECT kind, subject, detail FROM host_events",
          "SELECT count(*) FROM rejected_values",
          "SELECT slowdown_temperature_celsius FROM gpus"):
    print(q, "->", c.execute(q).fetchall())
PY
echo "== fast-set cost (1000 ticks)"
python3 bench/nvml_cost.py --ticks 1000 --runs 20 --json "$out/nvml_cost.json"
