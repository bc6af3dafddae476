"""The base layer: errors and exit codes, durations, secret masking, PCIe link arithmetic, worker
threads and tick pacing. Every other layer may import it; it imports nothing of vgpumon."""
