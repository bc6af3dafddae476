"""Cross-check vgpumon's NVML readings against ``nvidia-smi -q -x`` taken at the same moment, and
GPM PCIe RX against the bandwidth a torch copy loop measures itself.

Checks (idle GPU): memory used within 1 MiB; PCIe link generation/width (current and max) equal;
ECC counts (volatile/aggregate, corrected/uncorrected) and remapped rows equal; temperature
within 2 °C; power within 10 %; SM and memory clocks equal. Then, under a pinned host→device copy
loop: mean GPM RX of the ticks inside the loop within 10 % of what the loop measured.

Usage: python3 bench/crosscheck.py [--no-copy]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpumon.sources.nvml import NvmlSource  # noqa: E402

MIB = 2**20


def num(text: str | None) -> float | None:
    if text is None:
        return None
    head = text.strip().split(" ")[0].rstrip("x")
    try:
        return float(head)
    except ValueError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-copy", action="store_true")
    args = ap.parse_args()
    src = NvmlSource(slow_every=1)
    gpus = src.start()
    src.sample()
    time.sleep(1.0)
    reading = src.sample()
    xml = subprocess.run(["nvidia-smi", "-q", "-x"], check=True, capture_output=True, text=True).stdout
    root = ET.fromstring(xml)  # noqa: S314  parses nvidia-smi's own XML on the measuring host
    failures = 0
    rows = []

    def check(gpu: int, what: str, ours, theirs, ok: bool) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        rows.append(f"GPU {gpu}  {what:<34} vgpumon {ours!s:>14}  nvidia-smi {theirs!s:>14}  {'ok' if ok else 'MISMATCH'}")

    for g, s, x in zip(gpus, reading.samples, root.findall("gpu")):
        used = num(x.findtext("fb_memory_usage/used"))
        check(g.index, "memory used (MiB, ±1)", round(s.memory_used_bytes / MIB, 1), used, abs(s.memory_used_bytes / MIB - used) <= 1)
        reserved = num(x.findtext("fb_memory_usage/reserved"))
        check(g.index, "memory reserved (MiB, ±1)", round(s.memory_reserved_bytes / MIB, 1), reserved, abs(s.memory_reserved_bytes / MIB - reserved) <= 1)
        for ours, path in (
            (s.pcie_link_gen_current, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
            (g.pcie_link_gen_max, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
            (g.pcie_link_gen_gpu_max, "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen"),
            (s.pcie_link_width_current, "pci/pci_gpu_link_info/link_widths/current_link_width"),
            (g.pcie_link_width_max, "pci/pci_gpu_link_info/link_widths/max_link_width"),
        ):
            theirs = num(x.findtext(path))
            check(g.index, path.split("/")[-1], ours, theirs, ours == theirs)
        vol = x.find("ecc_errors/volatile")
        agg = x.find("ecc_errors/aggregate")
        def ecc(node, kind):
            if node is None:
                return None
            vals = [num(node.findtext(t)) for t in (("sram_correctable", "dram_correctable") if kind == "c" else ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable"))]
            return None if any(v is None for v in vals) else int(sum(vals))
        for ours, theirs, what in (
            (s.ecc_corrected_volatile_total, ecc(vol, "c"), "ECC corrected volatile"),
            (s.ecc_uncorrected_volatile_total, ecc(vol, "u"), "ECC uncorrected volatile"),
            (s.ecc_corrected_aggregate_total, ecc(agg, "c"), "ECC corrected aggregate"),
            (s.ecc_uncorrected_aggregate_total, ecc(agg, "u"), "ECC uncorrected aggregate"),
            (s.remapped_rows_correctable_total, num(x.findtext("remapped_rows/remapped_row_corr")), "remapped rows correctable"),
            (s.remapped_rows_uncorrectable_total, num(x.findtext("remapped_rows/remapped_row_unc")), "remapped rows uncorrectable"),
            (s.remapped_rows_pending, x.findtext("remapped_rows/remapped_row_pending") == "Yes", "remapped rows pending"),
            (s.remapped_rows_failure, x.findtext("remapped_rows/remapped_row_failure") == "Yes", "remapped rows failure"),
            (s.pcie_replay_total, num(x.findtext("pci/replay_counter")), "PCIe replay counter"),
        ):
            check(g.index, what, ours, theirs, ours == theirs)
        t = num(x.findtext("temperature/gpu_temp"))
        check(g.index, "temperature (°C, ±2)", s.temperature_celsius, t, abs(s.temperature_celsius - t) <= 2)
        p = num(x.findtext("gpu_power_readings/instant_power_draw")) or num(x.findtext("gpu_power_readings/power_draw"))
        check(g.index, "power (W, ±10 %)", round(s.power_watts, 2), p, abs(s.power_watts / p - 1) <= 0.10)
        lim = num(x.findtext("gpu_power_readings/current_power_limit"))
        check(g.index, "power limit (W)", s.power_limit_watts, lim, abs(s.power_limit_watts - lim) < 0.01)
        for ours, path in ((s.sm_clock_hertz, "clocks/sm_clock"), (s.memory_clock_hertz, "clocks/mem_clock")):
            theirs = num(x.findtext(path))
            check(g.index, f"{path} (MHz, idle)", ours / 1e6, theirs, ours / 1e6 == theirs)
        bar1 = num(x.findtext("bar1_memory_usage/total"))
        check(g.index, "BAR1 total (MiB)", s.bar1_total_bytes / MIB, bar1, s.bar1_total_bytes / MIB == bar1)
        pstate = x.findtext("performance_state")
        check(g.index, "performance state", f"P{s.performance_state}", pstate, f"P{s.performance_state}" == pstate)

    if not args.no_copy:
        import torch

        measured: dict[str, float] = {}

        def copy_loop(seconds: float) -> None:
            src_t = torch.empty(2**30, dtype=torch.uint8).pin_memory()
            dst = torch.empty(2**30, dtype=torch.uint8, device="cuda")
            dst.copy_(src_t)
            torch.cuda.synchronize()
            n, t0 = 0, time.time()
            measured["start"] = t0
            while time.time() - t0 < seconds:
                dst.copy_(src_t, non_blocking=True)
                torch.cuda.synchronize()
                n += 1
            measured["end"] = time.time()
            measured["bytes_per_second"] = n * 2**30 / (measured["end"] - t0)

        thread = threading.Thread(target=copy_loop, args=(8.0,))
        thread.start()
        ticks = []
        while thread.is_alive():
            time.sleep(1.0)
            ticks.append(src.sample())
        inside = [r.samples[0].pcie_rx_bytes_per_second for r in ticks if measured["start"] + 1.0 <= r.ts <= measured["end"]]
        gpm = sum(inside) / len(inside)
        ok = abs(gpm / measured["bytes_per_second"] - 1) <= 0.10
        failures += 0 if ok else 1
        rows.append(
            f"GPU 0  GPM PCIe RX vs copy loop (±10 %)   vgpumon {gpm / 1e9:>10.2f} GB/s  loop {measured['bytes_per_second'] / 1e9:>10.2f} GB/s"
            f"  ({len(inside)} ticks, ratio {gpm / measured['bytes_per_second']:.3f})  {'ok' if ok else 'MISMATCH'}"
        )
    src.close()
    print("\n".join(rows))
    print(f"{failures} mismatch(es)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
