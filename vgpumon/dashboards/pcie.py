"""PCIe capacity: per host, per GPU link and per shared upstream port (switch, root port), the
p95 and max of TX/RX against capacity, and the headroom left — the capacity review's question,
"can this host take two more cards?"."""

from __future__ import annotations

from vgpumon.dashboards.gpu import BY_GPU, GPU, GPU_VARS, HOST, against_capacity
from vgpumon.dashboards.kit import Q, bar, rate, rate_unit, ratio, table, ts, unit, variables
from vgpumon.dashboards.kit import dashboard as make

RANGE = "$__range"
STEP = "$__interval"


def _through_port(direction: str) -> str:
    """Bytes/s through each shared upstream port: the sum of the rates of the GPUs below it."""
    return (
        f"sum by (hostname, port) (vgpumon_gpu_pcie_{direction}_bytes_per_second{HOST} "
        f"* on (hostname, uuid) group_right vgpumon_pcie_upstream_gpu_info{HOST})"
    )


def _port_share(direction: str) -> str:
    return ratio(f"({_through_port(direction)})", f"vgpumon_pcie_upstream_link_capacity_bytes_per_second{HOST}", on="hostname, port")


def capacity():
    rows = [
        ("Per host", [
            ts(f"Host PCIe {d.upper()} (all GPUs)", f"Bytes/s all GPUs of the host {word} together.",
               Q(f"sum by (hostname) (vgpumon_gpu_pcie_{d}_bytes_per_second{GPU})", f"{{{{hostname}}}} {d.upper()}"),
               unit=unit(f"vgpumon_gpu_pcie_{d}_bytes_per_second"))
            for d, word in (("rx", "receive"), ("tx", "send"))
        ]),
        ("Per GPU link", [
            against_capacity("rx", "RX against the link's capacity"),
            against_capacity("tx", "TX against the link's capacity"),
        ] + [
            bar(f"{d.upper()} {what} share of link over the range", f"The {what} of each GPU's {d.upper()} share of its link over the dashboard's range.",
                Q(fn.format(f"vgpumon_gpu_pcie_{d}_link_share_ratio{GPU}[{RANGE}]"), BY_GPU), unit="percentunit", max_=1, w=6)
            for d in ("rx", "tx") for what, fn in (("p95", "quantile_over_time(0.95, {})"), ("max", "max_over_time({})"))
        ] + [
            bar("Headroom per link", "1 − the busiest direction's max share of the link over the range: what is left at the peak.",
                Q(f"1 - max_over_time(vgpumon_gpu_pcie_rx_link_share_ratio{GPU}[{RANGE}])", BY_GPU + " RX"),
                Q(f"1 - max_over_time(vgpumon_gpu_pcie_tx_link_share_ratio{GPU}[{RANGE}])", BY_GPU + " TX"), unit="percentunit", max_=1, w=24),
        ]),
        ("Per shared upstream port (switch, root port)", [
            ts(f"{d.upper()} through each shared port", f"Sum of the {d.upper()} bytes/s of the GPUs below each switch or root port that two "
               "or more GPUs share; dashed: the port's own link capacity. A host bridge has no link, so no capacity.",
               Q(_through_port(d), "{{hostname}} {{port}}"),
               Q(f"vgpumon_pcie_upstream_link_capacity_bytes_per_second{HOST}", "{{hostname}} {{port}} capacity"),
               unit=unit("vgpumon_gpu_pcie_rx_bytes_per_second"), dashed=".* capacity")
            for d in ("rx", "tx")
        ] + [
            bar(f"{d.upper()} p95 share of each shared port over the range", f"p95 over the range of the {d.upper()} through each port over its capacity.",
                Q(f"quantile_over_time(0.95, ({_port_share(d)})[{RANGE}:{STEP}])", "{{hostname}} {{port}}"), unit="percentunit", max_=1, w=8)
            for d in ("rx", "tx")
        ] + [
            bar("Headroom per shared port", "1 − the max share of the port's capacity over the range, per direction.",
                Q(f"1 - max_over_time(({_port_share('rx')})[{RANGE}:{STEP}])", "{{hostname}} {{port}} RX"),
                Q(f"1 - max_over_time(({_port_share('tx')})[{RANGE}:{STEP}])", "{{hostname}} {{port}} TX"), unit="percentunit", max_=1, w=8),
            table("GPUs below each shared port", "Which GPUs share each switch or root port (from sysfs at the agent's start).",
                  Q(f"vgpumon_pcie_upstream_gpu_info{GPU}"), unit="none", hide=("Time", "__name__", "Value"), w=24),
        ]),
        ("Link health", [
            ts("Link generation: current and max", "An idle link down-trains; under load, current below max is a fault or a slow slot.",
               Q(f"vgpumon_gpu_pcie_link_generation{GPU}", BY_GPU + " current"),
               Q(f"vgpumon_gpu_pcie_link_max_generation{GPU}", BY_GPU + " max"), unit="none", dashed=".* max"),
            ts("Link width: current and max", "Lanes the link runs with now, and the max of device ∧ slot.",
               Q(f"vgpumon_gpu_pcie_link_width{GPU}", BY_GPU + " current"),
               Q(f"vgpumon_gpu_pcie_link_max_width{GPU}", BY_GPU + " max"), unit="none", dashed=".* max"),
            ts("PCIe replays", "Link-level retransmissions per second (DCGM's budget per minute at x16: Gen3 8, Gen4 16, Gen5 31).",
               Q(rate("vgpumon_gpu_pcie_replays_total", GPU), BY_GPU), unit=rate_unit("vgpumon_gpu_pcie_replays_total"), w=24),
        ]),
    ]
    return make(
        "vgpumon-pcie", "PCIe capacity",
        "PCIe TX/RX per host, per GPU link and per shared upstream port against capacity: p95, max and headroom.",
        ["gpu", "pcie"], variables(*GPU_VARS), rows,
    )
