"""Memory that reading one large ``/metrics`` body costs the vLLM source.

The body is the real vLLM 0.32.0 busy scrape (``fixtures/vllm-real``) with its ``vllm:`` series
repeated under more ``model_name`` values (LoRA adapters each get their own series) until it is
about ``--mb`` MB, the size just under the 8 MiB response limit. The figure is the peak of Python
allocations (tracemalloc) while the body, already received as bytes, is read into a reading, as
``VllmSource`` does on its worker thread; the body itself is not counted.

Usage:
  python3 bench/vllm_parse_memory.py --fixtures ../shared/fixtures/vllm-real [--mb 7.9]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, required=True, help="the vllm-real fixture directory")
    ap.add_argument("--mb", type=float, default=7.9)
    args = ap.parse_args()
    from vgpumon.sources.vllm.metrics import parse_metrics
    from vgpumon.testing.vllm import with_adapters

    body = with_adapters((args.fixtures / "vllm-0.32.0-cpu__busy.txt").read_text(), int(args.mb * 1e6))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    reading = parse_metrics(body)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    print(
        f"body {len(body) / 1e6:.2f} MB, {len(reading.model_names)} model names: parse peak {peak / 2**20:.1f} MiB "
        f"({peak / len(body):.1f}x the body), {seconds:.2f} s"
    )


if __name__ == "__main__":
    main()
