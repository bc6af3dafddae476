"""Compile to .pyc every module a command imports, as `pip install` leaves them on a user's host.

Some hosts (the GPU host used for the measurements among them) ship their Python packages
without .pyc files. A process started there compiles every module it imports in memory, and the
compiler's allocations stay in its resident set: a footprint measured so is not the one users
get. This runs the command once with PYTHONPROFILEIMPORTTIME=1 (inherited by the agent's exec'd
process, so its lazy imports count too), collects every module named, and writes the .pyc of
each module's source where the import system looks for it.

    python bench/compile_imported.py -- python -m vgpumon agent --duration 20s --db sqlite:///x.db
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import py_compile
import re
import subprocess
import sys

_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")


def imported_modules(cmd: list[str]) -> set[str]:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, check=False)  # noqa: S603  a benchmark runs the command it is given
    return {m.group(1) for line in proc.stderr.splitlines() if (m := _LINE.match(line))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run once")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    names = imported_modules(cmd)
    compiled = failed = already = 0
    for name in sorted(names):
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001, S112 - a module that only exists in the child (a __main__ alias): skip it
            continue
        src = getattr(spec, "origin", None) if spec else None
        if not src or not src.endswith(".py") or not os.path.exists(src):
            continue
        cache = importlib.util.cache_from_source(src)
        if os.path.exists(cache) and os.path.getmtime(cache) >= os.path.getmtime(src):
            already += 1
            continue
        try:
            py_compile.compile(src, cfile=cache, doraise=True)
            compiled += 1
        except (py_compile.PyCompileError, OSError) as exc:
            failed += 1
            print(f"not compiled: {src}: {exc}", file=sys.stderr)
    print(f"{len(names)} modules imported: {compiled} compiled now, {already} were compiled, {failed} could not be")
    return 0


if __name__ == "__main__":
    sys.exit(main())
