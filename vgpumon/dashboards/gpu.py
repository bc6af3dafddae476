"""GPU fleet (hosts × GPUs at a glance) and GPU host detail (one host's GPUs over time)."""

from __future__ import annotations

from vgpumon.dashboards.kit import (
    Q,
    decode,
    increase,
    mappings,
    rate,
    rate_unit,
    ratio,
    sel,
    stat,
    states,
    table,
    ts,
    unit,
    variables,
    yes_no,
)
from vgpumon.dashboards.kit import dashboard as make

GPU = sel('hostname=~"$host"', 'gpu=~"$gpu"')
HOST = sel('hostname=~"$host"')
BY_GPU = "{{hostname}} GPU {{gpu}}"
GPU_VARS = ("vgpumon_gpu_info", "name", "GPU model", "vgpumon_gpu_info")
UP_DOWN = {0: "down", 1: "up"}

SM_ACTIVE = "Share of the GPU's SMs with work, averaged over each 1 s tick (GPM, Hopper and newer). This is what the GPU does."
UTIL = (
    "utilization.gpu: share of time *any* kernel or copy ran. Not SM activity: a host-to-device copy reads 100 % here "
    "while SM activity is 0 (measured on an H200)."
)


def _departure(metric: str) -> str:
    """Each GPU's reading over the median of its host's GPUs, minus 1 (no point where the median is 0)."""
    mine = f"max by (hostname, gpu) ({metric}{GPU})"
    median = f"quantile by (hostname) (0.5, max by (hostname, gpu) ({metric}{HOST}))"
    return f"{mine} / on (hostname) group_left () ({median} > 0) - 1"


def _straggler():
    return ts("Stragglers: departure from the host's median", "Each GPU's SM clock, power and SM activity against the median of "
              "its host's GPUs (0 = the median). Under the same work siblings stay within a few percent; GpuStraggler fires past "
              "10 % (clock) or 15 % (power, SM activity) over 5 busy minutes, naming the throttle reasons that explain it.",
              Q(_departure("vgpumon_gpu_sm_clock_hertz"), BY_GPU + " SM clock"),
              Q(_departure("vgpumon_gpu_power_usage_watts"), BY_GPU + " power"),
              Q(_departure("vgpumon_gpu_sm_active_ratio"), BY_GPU + " SM activity"), unit="percentunit", min_=None)


def against_capacity(direction: str, title: str):
    """A GPU's PCIe bytes/s in one direction beside its max link's capacity (dashed)."""
    word = {"rx": "received", "tx": "sent"}[direction]
    return ts(title, f"Bytes/s each GPU {word}, averaged over each tick (GPM); dashed: the capacity of its max link "
              "(device ∧ slot).", Q(f"vgpumon_gpu_pcie_{direction}_bytes_per_second{GPU}", f"{BY_GPU} {direction.upper()}"),
              Q(f"vgpumon_gpu_pcie_link_capacity_bytes_per_second{GPU}", BY_GPU + " capacity"),
              unit=unit(f"vgpumon_gpu_pcie_{direction}_bytes_per_second"), dashed=".* capacity")


#: How long the fleet tiles count a stopped host's GPUs as not readable: the look-back over
#: which its GPUs are still known (a subquery at 1 min steps: a day costs 1440 lookups a GPU).
KNOWN = "1d"
NOT_READABLE = (f"count((vgpumon_gpu_up{GPU} == 0) or (last_over_time(vgpumon_gpu_info{GPU}[{KNOWN}:1m]) "
                f"unless on (hostname, uuid) vgpumon_gpu_info{GPU}))")


def fleet():
    return make(
        "vgpumon-gpu-fleet", "GPU fleet",
        "Every host's GPUs at a glance: SM activity beside utilization, memory, PCIe share of link, health, alerts.",
        ["gpu"], variables(*GPU_VARS),
        [
            ("Fleet now", [
                stat("GPUs readable", "GPUs that answered NVML at their newest tick, now (a stopped agent's GPUs are "
                     "not counted, not held at their last value).",
                     Q(f"sum(vgpumon_gpu_up{GPU})", instant=True), unit="short", no_value="0"),
                stat("GPUs not readable", "GPUs the agent could not read (lost, reset, wedged), or whose newest tick is "
                     "older than three intervals; and the GPUs of a host whose agent stopped reporting, for a day "
                     "after its series went.", Q(NOT_READABLE, instant=True), unit="short", no_value="0",
                     thresholds=[(None, "green"), (1, "red")]),
                stat("Hosts", "Hosts whose agent serves GPUs.", Q(f"count(count by (hostname) (vgpumon_gpu_info{GPU}))"), unit="short"),
                stat("Agents with a source down", "Agents where a source (NVML, host, vLLM, kubelet) did not answer.",
                     Q(f"sum(vgpumon_agent_source_up{HOST} == bool 0)"), unit="short", thresholds=[(None, "green"), (1, "orange")]),
                table("Per GPU now", "Newest reading of each GPU; utilization is busy time, not SM activity.",
                      Q(f"vgpumon_gpu_sm_active_ratio{GPU}"), Q(f"vgpumon_gpu_utilization_ratio{GPU}"),
                      Q(ratio(f"vgpumon_gpu_memory_used_bytes{GPU}", f"vgpumon_gpu_memory_total_bytes{GPU}")),
                      Q(f"vgpumon_gpu_pcie_rx_link_share_ratio{GPU}"), Q(f"vgpumon_gpu_pcie_tx_link_share_ratio{GPU}"),
                      unit="percentunit", h=9,
                      hide=("Time", "__name__", "uuid"),
                      rename={"Value #A": "SM activity", "Value #B": "GPU util (busy time)", "Value #C": "memory used",
                              "Value #D": "PCIe RX share of link", "Value #E": "PCIe TX share of link"}),
            ]),
            ("Activity: SM activity beside utilization", [
                ts("SM activity (GPM)", SM_ACTIVE, Q(f"vgpumon_gpu_sm_active_ratio{GPU}", BY_GPU), unit=unit("vgpumon_gpu_sm_active_ratio"), max_=1),
                ts("GPU utilization (busy time, not SM activity)", UTIL, Q(f"vgpumon_gpu_utilization_ratio{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_utilization_ratio"), max_=1),
                ts("Memory used", "Device memory used by processes over the GPU's total (driver-reserved excluded).",
                   Q(ratio(f"vgpumon_gpu_memory_used_bytes{GPU}", f"vgpumon_gpu_memory_total_bytes{GPU}"), BY_GPU), unit="percentunit", max_=1),
                ts("Memory used (bytes)", "Device memory used by processes.", Q(f"vgpumon_gpu_memory_used_bytes{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_memory_used_bytes")),
                ts("PCIe RX share of link", "Bytes/s the GPU receives over the capacity of its max link (device ∧ slot).",
                   Q(f"vgpumon_gpu_pcie_rx_link_share_ratio{GPU}", BY_GPU), unit=unit("vgpumon_gpu_pcie_rx_link_share_ratio")),
                ts("PCIe TX share of link", "Bytes/s the GPU sends over the capacity of its max link (device ∧ slot).",
                   Q(f"vgpumon_gpu_pcie_tx_link_share_ratio{GPU}", BY_GPU), unit=unit("vgpumon_gpu_pcie_tx_link_share_ratio")),
            ]),
            ("Health", [
                states("GPU readable", "Down: the GPU did not answer NVML (lost, reset required, wedged).",
                       Q(f"vgpumon_gpu_up{GPU}", BY_GPU), maps=mappings(UP_DOWN), h=7),
                ts("XID events", "Driver-reported GPU errors per code, counted as they happen (a repeat is visible). "
                   "48, 62, 64, 74, 79, 95, 119, 120, 140 are critical; 13, 31, 43 are application errors.",
                   Q(f"sum by (hostname, gpu, xid) ({increase('vgpumon_gpu_xid_events_total', GPU)}) > 0", "{{hostname}} GPU {{gpu}} XID {{xid}}"),
                   unit="short", bars=True, no_value="no XID"),
                ts("XID classes: GPUs with the same code", "How many GPUs of the host reported each XID code in each interval. "
                   "The same code on one GPU again and again within 24 h points at that board (GpuXidRepeated: drain it, run the "
                   "vendor's diagnostics); the same code on several GPUs at once points at the workload or the driver (HostXidSpread).",
                   Q(f"count by (hostname, xid) (sum by (hostname, gpu, xid) ({increase('vgpumon_gpu_xid_events_total', GPU)}) > 0)",
                     "{{hostname}} XID {{xid}}"), unit="short", bars=True, no_value="no XID"),
                _straggler(),
                ts("ECC errors", "Uncorrectable volatile ECC errors: any is a reason to drain and reset the GPU. Corrected ones beside them.",
                   Q(f"sum by (hostname, gpu) ({increase('vgpumon_gpu_ecc_uncorrected_volatile_errors_total', GPU)})", BY_GPU + " uncorrected"),
                   Q(f"sum by (hostname, gpu) ({increase('vgpumon_gpu_ecc_corrected_volatile_errors_total', GPU)})", BY_GPU + " corrected"),
                   unit="short", bars=True),
                ts("Row remap pending or failed", "Pending: a remap waits for a GPU reset. Failed: the GPU needs replacing.",
                   Q(f"vgpumon_gpu_remapped_rows_pending{GPU}", BY_GPU + " pending"),
                   Q(f"vgpumon_gpu_remapped_rows_failure{GPU}", BY_GPU + " failed"), unit="none", maps=yes_no(), max_=1),
                table("Firing alerts", "Alerts the agents' rules engine holds as firing.",
                      Q('vgpumon_alerts{hostname=~"$host", state="firing"}'), unit="none", hide=("Time", "__name__", "Value")),
                table("Rules that cannot judge", "Rules the agents' engine cannot judge for a GPU or source, and why "
                      "(reason: not_reported, no_data, warming_up, rule_failed): their alerts cannot fire there, "
                      "so their silence is not health (VgpumonRuleCannotJudge; docs/exporter.md). Rules that do not apply "
                      "(reason not_applicable: no GPM, no ECC on the board) are not listed: nothing is missing there (docs/rules.md).",
                      Q('vgpumon_rule_unknown{hostname=~"$host", reason!="not_applicable"}'), unit="none", hide=("Time", "__name__", "Value")),
            ]),
        ],
    )


def host():
    return make(
        "vgpumon-gpu-host", "GPU host detail",
        "One host's GPUs over time: activity, memory, PCIe and link state, thermals and power with decoded throttle "
        "reasons, processes, and the agent's own health.",
        ["gpu"], variables(*GPU_VARS),
        [
            ("Activity", [
                ts("SM activity (GPM)", SM_ACTIVE, Q(f"vgpumon_gpu_sm_active_ratio{GPU}", BY_GPU), unit=unit("vgpumon_gpu_sm_active_ratio"), max_=1, w=8),
                ts("SM occupancy (GPM)", "Resident warps over the SMs' maximum.", Q(f"vgpumon_gpu_sm_occupancy_ratio{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_sm_occupancy_ratio"), max_=1, w=8),
                ts("GPU utilization (busy time, not SM activity)", UTIL, Q(f"vgpumon_gpu_utilization_ratio{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_utilization_ratio"), max_=1, w=8),
                ts("Tensor pipes active (GPM)", "Share of cycles any tensor pipe was active.", Q(f"vgpumon_gpu_tensor_active_ratio{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_tensor_active_ratio"), max_=1, w=8),
                ts("DRAM active (GPM)", "Share of cycles the memory interface was busy.", Q(f"vgpumon_gpu_dram_active_ratio{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_dram_active_ratio"), max_=1, w=8),
                ts("Memory controller utilization", "Share of time device memory was read or written (utilization.memory).",
                   Q(f"vgpumon_gpu_memory_utilization_ratio{GPU}", BY_GPU), unit=unit("vgpumon_gpu_memory_utilization_ratio"), max_=1, w=8),
            ]),
            ("Memory", [
                ts("Device memory", "Used by processes, reserved by the driver, and the total.",
                   Q(f"vgpumon_gpu_memory_used_bytes{GPU}", BY_GPU + " used"),
                   Q(f"vgpumon_gpu_memory_reserved_bytes{GPU}", BY_GPU + " reserved"),
                   Q(f"vgpumon_gpu_memory_total_bytes{GPU}", BY_GPU + " total"), unit=unit("vgpumon_gpu_memory_used_bytes"), dashed=".* total"),
                ts("Memory trend (leak estimate)", "The rules engine's robust slope of memory used; a steady positive slope is a "
                   "leak (0.3 GB a day is 3.5 kB/s).", Q(f"vgpumon_gpu_memory_used_slope_bytes_per_second{GPU}", BY_GPU),
                   unit=unit("vgpumon_gpu_memory_used_slope_bytes_per_second"), min_=None),
                ts("BAR1 used", "Host-visible window into device memory.", Q(f"vgpumon_gpu_bar1_used_bytes{GPU}", BY_GPU + " used"),
                   Q(f"vgpumon_gpu_bar1_total_bytes{GPU}", BY_GPU + " total"), unit=unit("vgpumon_gpu_bar1_used_bytes"), dashed=".* total"),
                table("GPU processes", "Processes holding GPU memory now, with their Kubernetes owner where the kubelet names one.",
                      Q(f"vgpumon_gpu_process_memory_used_bytes{GPU}"), unit=unit("vgpumon_gpu_process_memory_used_bytes"),
                      hide=("Time", "__name__", "uuid"), rename={"Value": "GPU memory"}, w=12),
                ts("GPU process host memory (RSS)", "Resident host memory of each GPU process: a leak that keeps request objects alive grows it too.",
                   Q(f"vgpumon_gpu_process_resident_memory_bytes{GPU}", "GPU {{gpu}} pid {{pid}} {{command}}"),
                   unit=unit("vgpumon_gpu_process_resident_memory_bytes")),
                ts("GPU process CPU", "CPU time per second (cores) of each GPU process.",
                   Q(rate("vgpumon_gpu_process_cpu_seconds_total", GPU), "GPU {{gpu}} pid {{pid}} {{command}}"), unit="short"),
            ]),
            ("PCIe and link state", [
                against_capacity("rx", "PCIe RX"),
                against_capacity("tx", "PCIe TX"),
                table("Link state now", "Current generation and width beside the max of device ∧ slot and of the device alone: "
                      "an idle link down-trains (compare under load); a GPU max above the slot's max means a slower slot.",
                      Q(f"vgpumon_gpu_pcie_link_generation{GPU}"), Q(f"vgpumon_gpu_pcie_link_max_generation{GPU}"),
                      Q(f"vgpumon_gpu_pcie_link_gpu_max_generation{GPU}"), Q(f"vgpumon_gpu_pcie_link_width{GPU}"),
                      Q(f"vgpumon_gpu_pcie_link_max_width{GPU}"), unit="none", hide=("Time", "__name__", "uuid"),
                      rename={"Value #A": "generation", "Value #B": "max generation (slot)", "Value #C": "GPU max generation",
                              "Value #D": "width", "Value #E": "max width"}, w=12),
                ts("PCIe replays", "Link-level retransmissions per second (DCGM's budget per minute at x16: Gen3 8, Gen4 16, Gen5 31).",
                   Q(rate("vgpumon_gpu_pcie_replays_total", GPU), BY_GPU), unit=rate_unit("vgpumon_gpu_pcie_replays_total")),
            ]),
            ("Thermals, power, clocks", [
                ts("Temperature", "GPU core and HBM temperature.", Q(f"vgpumon_gpu_temperature_celsius{GPU}", BY_GPU + " core"),
                   Q(f"vgpumon_gpu_memory_temperature_celsius{GPU}", BY_GPU + " HBM"), unit=unit("vgpumon_gpu_temperature_celsius"), min_=None),
                ts("Power", "Board power draw against the enforced limit (dashed).", Q(f"vgpumon_gpu_power_usage_watts{GPU}", BY_GPU),
                   Q(f"vgpumon_gpu_power_limit_watts{GPU}", BY_GPU + " limit"), unit=unit("vgpumon_gpu_power_usage_watts"), dashed=".* limit"),
                ts("Clocks", "SM and memory clocks.", Q(f"vgpumon_gpu_sm_clock_hertz{GPU}", BY_GPU + " SM"),
                   Q(f"vgpumon_gpu_memory_clock_hertz{GPU}", BY_GPU + " memory"), unit=unit("vgpumon_gpu_sm_clock_hertz")),
                ts("Energy", "Average power over the rate window, from the board's energy counter.",
                   Q(rate("vgpumon_gpu_energy_joules_total", GPU), BY_GPU), unit=rate_unit("vgpumon_gpu_energy_joules_total")),
                states("Clocks held down by", "Why clocks are below their maximum, decoded (gpu_idle is normal when idle; "
                       "sw_power_cap, hw_slowdown and the thermal reasons cost performance).",
                       Q(f"vgpumon_gpu_clocks_event_reason_active{GPU} == 1", "GPU {{gpu}} {{reason}}"), maps=mappings({1: "active"}), h=8),
                ts("Time throttled", "Share of time clocks were held down by the power limit or by temperature.",
                   Q(rate("vgpumon_gpu_power_violation_seconds_total", GPU), BY_GPU + " power"),
                   Q(rate("vgpumon_gpu_thermal_violation_seconds_total", GPU), BY_GPU + " thermal"),
                   unit=rate_unit("vgpumon_gpu_power_violation_seconds_total"), max_=1),
            ]),
            ("Modes and owners", [
                stat("Performance state", "P0 is the fastest.", Q(f"vgpumon_gpu_performance_state{GPU}", BY_GPU),
                     unit="none", maps=decode("vgpumon_gpu_performance_state"), w=6),
                stat("Compute mode", "", Q(f"vgpumon_gpu_compute_mode{GPU}", BY_GPU), unit="none", maps=decode("vgpumon_gpu_compute_mode"), w=6),
                stat("MIG mode", "", Q(f"vgpumon_gpu_mig_mode{GPU}", BY_GPU), unit="none", maps=decode("vgpumon_gpu_mig_mode"), w=6),
                stat("Persistence mode", "", Q(f"vgpumon_gpu_persistence_mode{GPU}", BY_GPU), unit="none", maps=yes_no(), w=6),
                table("Kubernetes holders", "Containers the kubelet allocated each GPU to; a GPU with several has no owner labels on its readings.",
                      Q(f"vgpumon_gpu_kubernetes_holder_info{GPU}"), unit="none", hide=("Time", "__name__", "Value", "uuid"), w=12),
            ]),
            ("Host and agent", [
                ts("Host CPU and memory", "CPU busy and memory that cannot be reclaimed, of the host the GPUs sit in.",
                   Q(f"vgpumon_host_cpu_ratio{HOST}", "{{hostname}} CPU"),
                   Q(ratio(f"vgpumon_host_memory_used_bytes{HOST}", f"vgpumon_host_memory_total_bytes{HOST}"), "{{hostname}} memory"),
                   unit="percentunit", max_=1),
                ts("Agent sources", "1 when the source answered (nvml, host, vllm, kubernetes).",
                   Q(f"vgpumon_agent_source_up{HOST}", "{{hostname}} {{source}}"), unit="none", maps=mappings(UP_DOWN), max_=1),
                ts("Impossible values refused", "Values a source reported that no field may hold (sentinels, out of range), per second.",
                   Q(rate("vgpumon_agent_rejected_values_total", HOST), "{{hostname}} {{source}} {{field}}"),
                   unit=rate_unit("vgpumon_agent_rejected_values_total")),
                ts("Rows waiting for the store", "Rows held while the store is away (spool on disk, then memory).",
                   Q(f"vgpumon_agent_backlog_rows{HOST}", "{{hostname}} {{where}}"), unit="short"),
            ]),
        ],
    )
