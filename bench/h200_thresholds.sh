#!/usr/bin/env bash
# The GPU's own temperature thresholds: what nvmlDeviceGetTemperatureThreshold answers for each
# threshold type, beside nvidia-smi -q's temperature section (driver 580 prints them relative to
# T.Limit). Output kept in bench/results/h200-thresholds.txt; the H200's slowdown answer (89 °C)
# is injected into the recorded captures' init block by the thermal-rule tests.
# Usage: bench/h200_thresholds.sh > bench/results/h200-thresholds.txt
set -uo pipefail
nvidia-smi -q -d TEMPERATURE
python3 - <<'PY'
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
print("nvidia-ml-py", getattr(nv, "__version__", "?"), "driver", nv.nvmlSystemGetDriverVersion(), "name", nv.nvmlDeviceGetName(h))
print("nvmlDeviceGetTemperature(GPU)", nv.nvmlDeviceGetTemperature(h, 0))
names = {0: "SHUTDOWN", 1: "SLOWDOWN", 2: "MEM_MAX", 3: "GPU_MAX", 4: "ACOUSTIC_MIN", 5: "ACOUSTIC_CURR", 6: "ACOUSTIC_MAX", 7: "GPS_CURR"}
for k, n in names.items():
    try:
        print(f"nvmlDeviceGetTemperatureThreshold({k} {n}) = {nv.nvmlDeviceGetTemperatureThreshold(h, k)}")
    except nv.NVMLError as e:
        print(f"nvmlDeviceGetTemperatureThreshold({k} {n}) error {e.value} {e}")
for fn in ("nvmlDeviceGetMarginTemperature",):
    try:
        print(fn, getattr(nv, fn)(h))
    except Exception as e:
        print(fn, "error", e)
PY
