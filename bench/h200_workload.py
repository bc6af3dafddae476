"""GPU workload for the reference capture: idle → pinned H2D copies → bf16 matmuls → a steadily
growing allocation → idle. Writes the wall-clock bounds of each phase (and what the program itself
measured) as JSON, so tests can check what the capture saw against what really happened.

Usage: python3 bench/h200_workload.py PHASES.json
"""

import json
import sys
import time

import torch

PHASE_SECONDS = 12.0
STEP_BYTES = 512 * 2**20  # growth phase: 512 MiB every 0.5 s, as in the leak of FACTS §1
STEP_SECONDS = 0.5


def main(out_path: str) -> None:
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.zeros(1, device=dev)  # create the context before the first idle phase
    phases = []
    info: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    def phase(name, fn):
        t0 = time.time()
        fn()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        phases.append({"name": name, "start": t0, "end": time.time()})

    phase("idle", lambda: time.sleep(8))

    def h2d():
        src = torch.empty(2**30, dtype=torch.uint8).pin_memory()
        dst = torch.empty(2**30, dtype=torch.uint8, device=dev)
        n, t0 = 0, time.time()
        while time.time() - t0 < PHASE_SECONDS:
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            n += 1
        info["h2d_bytes_per_second"] = n * 2**30 / (time.time() - t0)
        del src, dst

    phase("h2d_copy", h2d)
    phase("idle_a", lambda: time.sleep(3))

    def matmul():
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        n, t0 = 0, time.time()
        while time.time() - t0 < PHASE_SECONDS:
            for _ in range(10):
                c = a @ b
            torch.cuda.synchronize()
            n += 10
        info["matmul_tflops"] = n * 2 * 8192**3 / (time.time() - t0) / 1e12
        del a, b, c

    phase("matmul", matmul)
    phase("idle_b", lambda: time.sleep(3))

    held = []

    def growth():
        steps = int(PHASE_SECONDS / STEP_SECONDS)
        t0 = time.time()
        for i in range(steps):
            t = torch.empty(STEP_BYTES, dtype=torch.uint8, device=dev)
            t.fill_(1)
            held.append(t)
            torch.cuda.synchronize()
            time.sleep(max(0.0, t0 + (i + 1) * STEP_SECONDS - time.time()))
        info["growth_steps"] = steps
        info["growth_step_bytes"] = STEP_BYTES
        info["growth_total_bytes"] = steps * STEP_BYTES

    phase("growth", growth)
    phase("idle_end", lambda: time.sleep(6))
    info["phases"] = phases
    with open(out_path, "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: v for k, v in info.items() if k != "phases"}))


if __name__ == "__main__":
    main(sys.argv[1])
