"""Human rendering of reports ("N/A (reason)" lives here only; the data stays ``None``).

Every value is printed by its catalogue entry's display (``vgpumon.catalogue.fmt``), so a field's
unit and format are decided in one place; a name that is not in the catalogue raises.
"""

from __future__ import annotations

from typing import Any

from vgpumon import catalogue


def _show(name: str, value: Any, reason: str | None = None) -> str:
    """A ``gpu_samples`` field's value as reports print it."""
    return catalogue.fmt(("gpu_samples", name), value, reason)


def _na(reason: str | None) -> str:
    return catalogue.fmt(("gpu_samples", "up"), None, reason)


def render_diagnose(report: dict[str, Any]) -> str:
    """Plain-text diagnose report, one block per GPU."""
    out = [f"host {report['host']}: {report['status'].upper()}"]
    w = report.get("window")
    if w:
        age = report.get("newest_sample_age_seconds")
        out.append(f"window {w['start']} → {w['end']} ({w['seconds']:.0f} s; newest sample {age:.0f} s old)")
    for f in report.get("findings", []):
        out.append(f"  [{f['severity'].upper()}] {f['message']}")
    for g in report["gpus"]:
        u = g["unknown"]
        out.append("")
        out.append(f"GPU {g['index']}  {g['name'] or _na('name')}  {g['uuid']}  bus {g['pci_bus_id'] or 'N/A'}")
        out.append(f"  samples         {g['samples']} ({g['up_samples']} readable)")
        sm = g["sm_active"]
        key = "sm_active_ratio" if sm["source"] == "gpm" else "utilization_gpu_ratio"
        label = "SM activity" if sm["source"] == "gpm" else "GPU util (proxy: no GPM, not SM activity)"
        out.append(
            f"  {label:<15} mean {_show(key, sm['mean_ratio'], u.get(key + '.mean'))}"
            f"  max {_show(key, sm['max_ratio'], u.get(key + '.max'))}"
        )
        occ = g["sm_occupancy"]
        out.append(
            f"  SM occupancy    mean {_show('sm_occupancy_ratio', occ['mean_ratio'], u.get('sm_occupancy_ratio.mean'))}"
            f"  max {_show('sm_occupancy_ratio', occ['max_ratio'], u.get('sm_occupancy_ratio.max'))}"
        )
        m = g["memory"]
        out.append(
            f"  memory used     last {_show('memory_used_bytes', m['used_last_bytes'], 'no sample')}"
            f"  max {_show('memory_used_bytes', m['used_max_bytes'], u.get('memory_used_bytes.max'))}"
            f"  of {_show('memory_total_bytes', m['total_bytes'])}"
            f"  (driver reserved {_show('memory_reserved_bytes', m['reserved_last_bytes'], 'memory v2 not available')})"
        )
        p = g["pcie"]
        lm, lc = p["link_max"], p["link_current"]
        cap = lm["capacity_bytes_per_second"]
        out.append(
            f"  PCIe link       max Gen{lm['generation'] or '?'} x{lm['width'] or '?'}"
            f" ({_show('pcie_rx_bytes_per_second', cap, u.get('pcie.link_max'))} per direction)"
            f"  current Gen{lc['generation'] or '?'} x{lc['width'] or '?'}"
        )
        path = p.get("path") or []
        if len(path) > 1:
            hops = []
            for hop in path[1:]:
                if hop["kind"] == "host_bridge":
                    hops.append(f"host bridge {hop['bdf']}")
                    continue
                lm = hop["link_max"]
                shared = f", shared with GPU {', '.join(map(str, hop['shared_with_gpus']))}" if hop["shared_with_gpus"] else ""
                hops.append(f"{hop['kind']} {hop['bdf']} Gen{lm['generation'] or '?'} x{lm['width'] or '?'}{shared}")
            out.append("  PCIe path       " + " → ".join(hops))
        for d in ("tx", "rx"):
            x = p[d]
            col = f"pcie_{d}_bytes_per_second"
            out.append(
                f"  PCIe {d.upper()}         mean {_show(col, x['mean_bytes_per_second'], u.get(col + '.mean'))}"
                f" ({_show('sm_active_ratio', x['mean_share_of_max_link'], 'n/a')} of max link)"
                f"  max {_show(col, x['max_bytes_per_second'], u.get(col + '.max'))}"
                f" ({_show('sm_active_ratio', x['max_share_of_max_link'], 'n/a')})"
            )
        e = g["ecc"]
        out.append(
            "  ECC             "
            + "  ".join(f"{k.replace('_', ' ')} {_show(f'ecc_{k}_total', e[k], u.get('ecc.' + k))}" for k in e)
        )
        t, pw, ck = g["temperature"], g["power"], g["sm_clock"]
        out.append(
            f"  temperature     mean {_show('temperature_celsius', t['mean_celsius'], u.get('temperature_celsius.mean'))}"
            f"  max {_show('temperature_celsius', t['max_celsius'], u.get('temperature_celsius.max'))}"
        )
        out.append(
            f"  power           mean {_show('power_watts', pw['mean_watts'], u.get('power_watts.mean'))}"
            f"  max {_show('power_watts', pw['max_watts'], u.get('power_watts.max'))}"
        )
        out.append(
            f"  SM clock        mean {_show('sm_clock_hertz', ck['mean_hertz'], u.get('sm_clock_hertz.mean'))}"
            f"  max {_show('sm_clock_hertz', ck['max_hertz'], u.get('sm_clock_hertz.max'))}"
        )
        for f in g["findings"]:
            out.append(f"  [{f['severity'].upper()}] {f['message']}")
        for rule, reason in g.get("rules_unknown", {}).items():
            out.append(f"  [UNKNOWN RULE] {rule}: {reason}")
    for u in report.get("rules_unknown", []):
        subject = ", ".join(f"{k}={v}" for k, v in u["labels"].items() if k != "hostname")
        out.append(f"[UNKNOWN RULE] {u['rule']}{' (' + subject + ')' if subject else ''}: {u['reason']}")
    if report.get("store_note"):  # e.g. a SQLite store read as an immutable snapshot
        out += ["", f"store {report['store_note']}"]
    return "\n".join(out)
