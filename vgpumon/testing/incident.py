"""An 8-GPU incident derived from the recorded H200 captures, for the exporter's golden files, the
dashboards' end-to-end test against a real Prometheus, and demos.

Every reading was once answered by the H200 (tests/data/README.md); the incident is a documented
transformation of them (``vgpumon.testing.scenarios``):

1. the workload capture (idle → host-to-device copies at 55 GB/s → matmuls → a growing
   allocation), 76 ticks at 1 s;
2. grafted with the idle HBM capture of the same board and driver for the calls the workload
   capture predates (HBM temperature, P-state, BAR1, remapped rows, replay counter, power limit,
   violation times, modes, XID polling);
3. replicated to 8 GPUs (distinct UUIDs and bus ids), so the copy phase loads every link at once;
4. then, as seen in the wild (FACTS §4, §7):

   * GPU 2: application XIDs 13 (tick 20) and 31 (tick 21) — they never page alone;
   * GPU 3: uncorrectable volatile ECC errors from tick 40 (1, then 2 from tick 50; the corrected
     count rises beside them) and a row remap pending — drain and reset;
   * GPU 5: XID 79 (fallen off the bus) at tick 45, then every call answers GPU_IS_LOST: the
     GPU is lost for the rest of the run;
   * GPU 6: utilization.gpu reads 4294967295 (NVML's blank) in ticks 30–32: refused at the door,
     counted, the rest of its tick kept.

5. for the demo (``uplink_bound``): every card's PCIe TX and RX rates (GPM metrics 20 and 21)
   scaled to a quarter, what four cards sharing one Gen5 x16 uplink get when each copies at
   once. Replicated as recorded, the four cards behind a switch would move 3.6 links' worth of
   traffic through its one link, which no link carries (the capacity review calls it
   IMPOSSIBLE); bound by the uplink, the switch runs at 89 % of its link at p95 (SATURATED),
   each card at 22 % of its own, and two more cards would bring it to 134 %.
"""

from __future__ import annotations

import json
from pathlib import Path

from vgpumon.model import GpuIdentity
from vgpumon.sources.nvml.backend import NVML_ERROR_GPU_IS_LOST
from vgpumon.sources.nvml.shapes import CaptureHeader, NvmlAnswer
from vgpumon.testing import scenarios, sysfs

GPUS = 8
BLANK_GPU, BLANK_TICKS = 6, (30, 31, 32)
APP_XID_GPU, APP_XIDS = 2, ((20, 13), (21, 31))
ECC_GPU, ECC_FROM = 3, 40
LOST_GPU, LOST_XID, LOST_AT = 5, 79, 45

#: GPM metric ids of PCIe TX and RX (MB/s; nvml.h NVML_GPM_METRIC_PCIE_TX_PER_SEC, _RX_PER_SEC),
#: the metric set the captures read, and the share of each card's rate an uplink shared by the
#: four cards behind it leaves (step 5 of the module docstring)
_PCIE_METRICS, _GPM_SET, UPLINK_SHARE = ("20", "21"), [[2, 3, 5, 10, 20, 21]], 0.25

# nvml.h: nvmlMemoryErrorType_t CORRECTED 0, UNCORRECTED 1; nvmlEccCounterType_t VOLATILE 0.
_CORRECTED, _UNCORRECTED, _VOLATILE, _AGGREGATE = 0, 1, 0, 1


def build(data_dir: str | Path, *, uplink_bound: bool = False) -> tuple[CaptureHeader, scenarios.Ticks]:
    """The incident capture as ``(header, ticks)`` (see the module docstring).

    Args:
        data_dir: the directory of the recorded captures (``tests/data``).
        uplink_bound: scale each card's PCIe rates to the share of the uplink the four cards
            behind each switch of ``sysfs_tree`` leave it (step 5): a plausible shared-switch
            load, for the demo. Without it the recorded rates stay on every card.
    """
    data = Path(data_dir)
    header, ticks = scenarios.load(str(data / "h200-workload.jsonl.gz"))
    header, ticks = scenarios.graft(header, ticks, *scenarios.load(str(data / "h200-idle-hbm.jsonl.gz")))
    header, ticks = scenarios.replicate_devices(header, ticks, GPUS)
    ts = {t["tick"]: t["ts"] for t in ticks}
    for at, xid in APP_XIDS:
        header, ticks = scenarios.set_call(
            header, ticks, "sys", "xid_poll", {"v": [{"index": APP_XID_GPU, "xid": xid, "ts": ts[at]}]}, at=[at]
        )
    header, ticks = scenarios.set_call(
        header, ticks, "sys", "xid_poll", {"v": [{"index": LOST_GPU, "xid": LOST_XID, "ts": ts[LOST_AT]}]}, at=[LOST_AT]
    )
    header, ticks = scenarios.fail_call(header, ticks, "*", NVML_ERROR_GPU_IS_LOST, from_tick=LOST_AT + 1, devices={LOST_GPU})
    header, ticks = scenarios.edit_call(
        header, ticks, BLANK_GPU, "nvmlDeviceGetUtilizationRates", lambda v: {**v, "gpu": 2**32 - 1}, at=BLANK_TICKS
    )
    slow = [t["tick"] for t in ticks if t["tick"] >= ECC_FROM and scenarios.is_slow_tick(t)]
    for n, at in enumerate(slow):
        uncorrected = 1 if n == 0 else 2
        for args, value in (
            ((_UNCORRECTED, _VOLATILE), uncorrected),
            ((_UNCORRECTED, _AGGREGATE), uncorrected),
            ((_CORRECTED, _VOLATILE), 3 + 4 * n),
            ((_CORRECTED, _AGGREGATE), 3 + 4 * n),
        ):
            header, ticks = scenarios.set_call(header, ticks, ECC_GPU, "nvmlDeviceGetTotalEccErrors", {"v": value}, at=[at], args=args)
        header, ticks = scenarios.set_call(header, ticks, ECC_GPU, "nvmlDeviceGetRemappedRows", {"v": [0, uncorrected, 1, 0]}, at=[at])
    derived = f"{header['derived']} incident(8 GPUs: app XIDs, ECC, XID 79 + lost GPU, a blank utilization)"
    if uplink_bound:
        header, ticks = _share_uplink(header, ticks)
        derived += f" uplink_bound(PCIe × {UPLINK_SHARE})"
    return {**header, "derived": derived}, ticks


def _share_uplink(header: CaptureHeader, ticks: scenarios.Ticks) -> tuple[CaptureHeader, scenarios.Ticks]:
    """Every card's GPM PCIe TX/RX rates times ``UPLINK_SHARE``, in every tick that read them."""
    def scaled(v: NvmlAnswer) -> NvmlAnswer:
        if not isinstance(v, dict):  # a tick whose GPM read answered otherwise keeps its answer
            return v
        return {k: (x * UPLINK_SHARE if k in _PCIE_METRICS and isinstance(x, (int, float)) else x) for k, x in v.items()}

    every = [t["tick"] for t in ticks]
    for gpu in range(GPUS):
        header, ticks = scenarios.edit_call(header, ticks, gpu, "gpm", scaled, at=every, args=_GPM_SET)
    return header, ticks


def sysfs_tree(data_dir: str | Path, dest: str | Path) -> Path:
    """Lay out under ``dest`` a sysfs tree for the incident's 8 GPUs, derived from the one
    recorded above the H200 (``vgpumon.testing.sysfs.switch_tree``: four GPUs behind each PCIe
    switch, one switch per root port, every link Gen5 x16 as recorded); pass it to
    ``vgpumon agent --sysfs``."""
    real = json.loads((Path(data_dir) / "h200-sysfs.json").read_text())
    gpus = [GpuIdentity(index=i, uuid=f"gpu{i}", pci_bus_id=scenarios.bus_id(i)) for i in range(GPUS)]
    return sysfs.materialize(sysfs.switch_tree(real, gpus, per_switch=4), dest)


def write(data_dir: str | Path, dest: str | Path, *, tick_seconds: float | None = None, uplink_bound: bool = False) -> Path:
    """Write the incident capture to ``dest`` (``.jsonl.gz``) for ``vgpumon agent --replay``.

    Args:
        uplink_bound: as for ``build`` (the demo's plausible shared-switch load).
        tick_seconds: space the ticks this far apart instead of the recorded 1 s, so that a
            replay at recorded pace runs faster (rates derived from counters over capture time
            scale with it).
    """
    header, ticks = build(data_dir, uplink_bound=uplink_bound)
    if tick_seconds is not None:
        header, ticks = scenarios.retime(header, ticks, tick_seconds / float(header.get("interval_s", 1.0)))
    scenarios.write(dest, header, ticks)
    return Path(dest)
