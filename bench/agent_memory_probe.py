"""Where the agent's resident memory goes: runs ``vgpumon agent`` in this process and, after
``--at`` seconds, writes what it holds, then lets the agent finish (``--duration`` in its
arguments should outlast ``--at``).

Reported: RSS split into anonymous and file-backed pages (``/proc/self/status``), the largest
mappings (``/proc/self/smaps``), the modules loaded per top-level package, the RSS of a fresh
interpreter that imports the same modules and calls ``nvmlInit`` (the floor for this set of
features), and — with ``--tracemalloc`` — the Python allocations still held, by line.

Usage: python3 bench/agent_memory_probe.py --at 40 [--tracemalloc] -- agent --duration 60s --db ...
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"):
                out[k] = int(v.split()[0])
    return out


def mappings(top: int = 15) -> list[tuple[int, str]]:
    rss: collections.Counter[str] = collections.Counter()
    name = "?"
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                name = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                rss[name] += int(parts[1])
    return [(kb, n) for n, kb in rss.most_common(top)]


def report(at: float, trace: bool) -> None:
    time.sleep(at)
    st = status()
    lines = [f"after {at:g} s: RSS {st['VmRSS'] / 1024:.1f} MB = anon {st['RssAnon'] / 1024:.1f} + file {st['RssFile'] / 1024:.1f}"
             f" + shmem {st['RssShmem'] / 1024:.1f}; threads {st['Threads']}"]
    lines.append("largest mappings (MB):")
    lines += [f"  {kb / 1024:7.1f}  {n}" for kb, n in mappings()]
    mods = sorted(m for m in list(sys.modules) if not m.startswith("__"))
    per = collections.Counter(m.split(".")[0] for m in mods)
    lines.append(f"modules: {len(mods)}; by package: " + ", ".join(f"{k} {v}" for k, v in per.most_common(25)))
    tops = sorted({m.split(".")[0] for m in mods} - {"__main__", "bench", "fake_nvml"})
    importable = []
    for m in mods:
        if m.split(".")[0] in tops and "._" not in m:
            importable.append(m)
    code = (
        "import importlib, sys\n"
        f"for m in {importable!r}:\n"
        "    try:\n        importlib.import_module(m)\n    except Exception:\n        pass\n"
        "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept Exception:\n    pass\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
    )
    floor = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines.append(f"floor (same modules imported + nvmlInit, fresh process): {int(floor.stdout.strip() or 0) / 1024:.1f} MB")
    if trace:
        import tracemalloc

        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("filename")
        total = sum(s.size for s in stats)
        lines.append(f"tracemalloc: {total / 1e6:.1f} MB held by Python allocations; largest files:")
        lines += [f"  {s.size / 1e6:7.2f} MB {s.count:7d} blocks  {s.traceback[0].filename}" for s in stats[:25]]
    print("\n".join(lines), file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--at", type=float, default=40.0)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--fake-gpus", type=int, default=0)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start()
    if args.fake_gpus:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import fake_nvml

        fake_nvml.install(args.fake_gpus)
    threading.Thread(target=report, args=(args.at, args.tracemalloc), daemon=True).start()
    sys.argv = ["vgpumon", *[a for a in args.argv if a != "--"]]
    # measured in this process, so not exec'd into the lean agent (vgpumon.agent.process): this
    # probe shows the CLI-process agent; bench/agent_footprint.py measures the real one.
    os.environ["VGPUMON_AGENT_EXEC"] = "0"
    from vgpumon.__main__ import main as vgpumon_main

    vgpumon_main()


if __name__ == "__main__":
    main()
