#!/usr/bin/env bash
# End-to-end check of the live agent on a GPU host: every nvidia-smi field named in the metrics
# catalogue is a valid --query-gpu field; a live agent run with a torch process holding GPU
# memory stores GPU rows, host samples, the process with its owner, and the PCIe topology.
# Usage: bench/h200_live_check.sh OUTDIR
set -uo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
fields=$(python3 -c "
from vgpumon.catalogue import FIELDS
print(','.join(sorted({f.smi for f in FIELDS if f.smi[:1].isalpha() and ' ' not in f.smi and f.smi not in ('—',)})))")
echo "== nvidia-smi accepts the catalogue's fields: $fields"
nvidia-smi --query-gpu="$fields" --format=csv || echo "SOME FIELD IS NOT VALID"
echo "== live agent with a torch process holding 2 GiB"
python3 -c "import torch, time; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); time.sleep(40)" &
holder=$!
sleep 8
python3 -m vgpumon --log-level info agent --duration 20s --db "sqlite:///$out/live.db"
echo "agent exit $?"
kill $holder 2>/dev/null
python3 -m vgpumon diagnose localhost --db "sqlite:///$out/live.db"
echo "diagnose exit $?"
python3 - "$out/live.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for q in ("SELECT count(*) FROM gpu_samples", "SELECT count(*) FROM host_samples",
          "SELECT pid, name, username, resolved, substr(cmdline, 1, 60) FROM processes",
          "SELECT count(*), max(used_gpu_memory_bytes), max(rss_bytes) FROM gpu_process_samples",
          "SELECT bdf, kind, parent_bdf, link_gen_max, link_width_max FROM pcie_links"):
    print(q, "->", c.execute(q).fetchall())
PY
