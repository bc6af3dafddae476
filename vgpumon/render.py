"""Human rendering of reports ("N/A (reason)" lives here only; the data stays ``None``)."""

from __future__ import annotations

from typing import Any


def _na(reason: str | None) -> str:
    return f"N/A ({reason})" if reason else "N/A"


def pct(v: float | None, reason: str | None = None) -> str:
    return _na(reason) if v is None else f"{v * 100:.1f} %"


def gib(v: float | None, reason: str | None = None) -> str:
    return _na(reason) if v is None else f"{v / 2**30:.2f} GiB"


def gbps(v: float | None, reason: str | None = None) -> str:
    return _na(reason) if v is None else f"{v / 1e9:.2f} GB/s"


def num(v: float | None, unit: str, reason: str | None = None, fmt: str = "{:.0f}") -> str:
    return _na(reason) if v is None else f"{fmt.format(v)} {unit}"


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
        label = "SM activity" if sm["source"] == "gpm" else "GPU util (proxy: no GPM, not SM activity)"
        key = "sm_active_ratio" if sm["source"] == "gpm" else "utilization_gpu_ratio"
        out.append(
            f"  {label:<15} mean {pct(sm['mean_ratio'], u.get(key + '.mean'))}  max {pct(sm['max_ratio'], u.get(key + '.max'))}"
        )
        occ = g["sm_occupancy"]
        out.append(
            f"  SM occupancy    mean {pct(occ['mean_ratio'], u.get('sm_occupancy_ratio.mean'))}"
            f"  max {pct(occ['max_ratio'], u.get('sm_occupancy_ratio.max'))}"
        )
        m = g["memory"]
        out.append(
            f"  memory used     last {gib(m['used_last_bytes'], 'no sample')}  max {gib(m['used_max_bytes'], u.get('memory_used_bytes.max'))}"
            f"  of {gib(m['total_bytes'])}  (driver reserved {gib(m['reserved_last_bytes'], 'memory v2 not available')})"
        )
        p = g["pcie"]
        lm, lc = p["link_max"], p["link_current"]
        cap = lm["capacity_bytes_per_second"]
        out.append(
            f"  PCIe link       max Gen{lm['generation'] or '?'} x{lm['width'] or '?'} ({gbps(cap, u.get('pcie.link_max'))} per direction)"
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
                f"  PCIe {d.upper()}         mean {gbps(x['mean_bytes_per_second'], u.get(col + '.mean'))}"
                f" ({pct(x['mean_share_of_max_link'], 'n/a')} of max link)"
                f"  max {gbps(x['max_bytes_per_second'], u.get(col + '.max'))} ({pct(x['max_share_of_max_link'], 'n/a')})"
            )
        e = g["ecc"]
        out.append(
            "  ECC             "
            + "  ".join(f"{k.replace('_', ' ')} {e[k] if e[k] is not None else _na(u.get('ecc.' + k))}" for k in e)
        )
        t, pw, ck = g["temperature"], g["power"], g["sm_clock"]
        out.append(
            f"  temperature     mean {num(t['mean_celsius'], '°C', u.get('temperature_celsius.mean'), '{:.1f}')}"
            f"  max {num(t['max_celsius'], '°C', u.get('temperature_celsius.max'))}"
        )
        out.append(
            f"  power           mean {num(pw['mean_watts'], 'W', u.get('power_watts.mean'), '{:.1f}')}"
            f"  max {num(pw['max_watts'], 'W', u.get('power_watts.max'), '{:.1f}')}"
        )
        out.append(
            f"  SM clock        mean {num(None if ck['mean_hertz'] is None else ck['mean_hertz'] / 1e6, 'MHz', u.get('sm_clock_hertz.mean'))}"
            f"  max {num(None if ck['max_hertz'] is None else ck['max_hertz'] / 1e6, 'MHz', u.get('sm_clock_hertz.max'))}"
        )
        for f in g["findings"]:
            out.append(f"  [{f['severity'].upper()}] {f['message']}")
    if report.get("store_note"):  # e.g. a SQLite store read as an immutable snapshot
        out += ["", f"store {report['store_note']}"]
    return "\n".join(out)
