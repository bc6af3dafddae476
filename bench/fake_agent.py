"""``vgpumon`` on a machine without a GPU, its live path intact: ``bench/fake_nvml.py`` stands in
for libnvidia-ml.so (``--fake-gpus N``, default 1), then the CLI runs as ``python -m vgpumon``.
For profiling the agent's own work (event loop, discovery, store, rules, exporter) on a laptop;
never for the docs' figures, which come from the H200.

Usage: python3 bench/fake_agent.py [--fake-gpus N] agent --duration 60s --db sqlite:////tmp/f.db
``VGPUMON_BENCH_PROFILE=out.prof`` writes a cProfile of the main thread (the event loop).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    gpus = 1
    if len(sys.argv) > 2 and sys.argv[1] == "--fake-gpus":
        gpus = int(sys.argv[2])
        del sys.argv[1:3]
    import fake_nvml

    fake_nvml.install(gpus)
    import os

    # the fake lives in this process: the agent must not exec into its lean one (agent_main)
    os.environ["VGPUMON_AGENT_EXEC"] = "0"
    from vgpumon.__main__ import main

    sys.argv[0] = "vgpumon"

    out = os.environ.get("VGPUMON_BENCH_PROFILE")  # a cProfile of the main thread (the event loop)
    if out:
        import cProfile

        cProfile.run("main()", out)
    else:
        main()
