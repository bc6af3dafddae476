#!/usr/bin/env bash
# The catalogue's fields on a real GPU: nvidia-smi accepts every --query-gpu name the catalogue
# gives, HBM temperature read through nvmlDeviceGetFieldValues matches nvidia-smi's
# temperature.memory, and a short masked capture keeps the field-values answer for tests/data.
# Usage: bench/h200_catalogue_check.sh OUTDIR
set -uo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
fields=$(python3 -c "
from vgpumon.catalogue import FIELDS
print(','.join(sorted({f.smi for f in FIELDS if f.smi and f.smi[:1].isalpha() and ' ' not in f.smi and not f.smi.startswith('--')})))")
echo "== nvidia-smi accepts the catalogue's fields"
nvidia-smi --query-gpu="$fields" --format=csv || echo "SOME FIELD IS NOT VALID"
echo "== nvidia-smi temperature.gpu, temperature.memory (before)"
nvidia-smi --query-gpu=temperature.gpu,temperature.memory --format=csv,noheader
echo "== record 12 s (masked)"
python3 -m vgpumon record "$out/h200-idle-hbm.jsonl.gz" --duration 12s --slow-every 2 --mask
echo "record exit $?"
echo "== nvidia-smi temperature.memory (after)"
nvidia-smi --query-gpu=temperature.gpu,temperature.memory --format=csv,noheader
python3 - "$out/h200-idle-hbm.jsonl.gz" <<'PY'
import sys
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.backend import EndOfCapture, ReplayBackend
src = NvmlSource(ReplayBackend(sys.argv[1])); src.start(); temps = []
while True:
    try:
        s = src.sample().samples[0]
    except EndOfCapture:
        break
    temps.append((s.temperature_celsius, s.memory_temperature_celsius, s.missing.get("memory_temperature_celsius")))
print("replayed (gpu °C, HBM °C, reason):", temps)
print("rejected:", dict(src.rejected))
PY
