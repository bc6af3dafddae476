"""The host source names the owners of GPU processes (real psutil, real processes)."""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from pathlib import Path

from vgpumon.sources.host import HostSource, container_id_from_cgroup

CID = "3f1c0d2b9e8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e"


def _sampled_once_it_runs(proc: subprocess.Popen, marker: str):
    """The host source's view of ``proc``, read once the kernel shows its command line (the
    condition: a loaded machine may not have it yet right after the fork)."""
    deadline = time.monotonic() + 60
    while marker.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return HostSource().sample(0.0, [proc.pid]).processes[proc.pid]


def test_process_owner_memory_and_cpu_of_a_real_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        src = HostSource()
        src.sample(0.0)
        import time

        time.sleep(0.5)
        h = src.sample(1.0, [proc.pid])
        info = h.processes[proc.pid]
        assert info.resolved and info.name.startswith("python")
        assert "time.sleep(30)" in info.cmdline
        assert info.username == getpass.getuser()
        assert info.rss_bytes > 64 << 20  # the 64 MiB it holds
        assert info.cpu_seconds_total is not None and info.start_time > 0
        assert 0 <= h.cpu_ratio <= 1 and h.memory_used_bytes < h.memory_total_bytes
    finally:
        proc.kill()
        proc.wait()


def test_gone_or_foreign_pid_is_kept_unresolved():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    h = HostSource().sample(0.0, [proc.pid])
    info = h.processes[proc.pid]
    assert not info.resolved and info.name is None
    assert "no such process" in info.unresolved_reason


def test_first_cpu_reading_is_unknown_not_zero():
    assert HostSource().sample(0.0).cpu_ratio is None


def test_container_ids_from_cgroup_v1_and_v2():
    assert container_id_from_cgroup(f"0::/system.slice/docker-{CID}.scope\n") == CID
    assert container_id_from_cgroup(f"12:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n") == CID
    assert container_id_from_cgroup(f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope\n") == CID
    assert container_id_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None


def test_a_gpu_process_command_line_keeps_no_secret():
    """A vLLM server started with its API key and a Hugging Face token on its command line (as
    people do): the agent reads it as root and would store and show it; the door masks the
    values and keeps the rest, so the on-call still sees which server it is."""
    key, token = "sk-live-0123456789abcdefghij", "hf_abcdefghijklmnopqrstuvwxyz012345"
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(60)", "serve", "tiny",
                             "--api-key", key, f"--hf-token={token}", "--port", "8000", "--max-num-batched-tokens", "8192"])
    try:
        info = _sampled_once_it_runs(proc, key)
        assert info.resolved and info.cmdline is not None
        assert key not in info.cmdline and token not in info.cmdline
        assert "--api-key *** --hf-token=*** --port 8000 --max-num-batched-tokens 8192" in info.cmdline
    finally:
        proc.kill()
        proc.wait()


def test_masking_finds_the_secrets_people_put_in_command_lines_and_leaves_the_rest():
    from vgpumon.base.masking import mask_command_line, mask_secrets

    assert mask_command_line(["env", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwx", "OPENAI_API_KEY=abc", "vllm"]) == \
        "env HF_TOKEN=*** OPENAI_API_KEY=*** vllm"
    assert mask_secrets("--password=hunter2 --db postgresql://u:pw@h/x") == "--password=*** --db postgresql://u:***@h/x"
    assert mask_secrets("Authorization: Bearer eyJhbGciOi.J9.sig") == "Authorization: Bearer ***"
    assert mask_command_line(["curl", "-H", "Authorization: Basic dXNlcjpwYXNz", "http://h/"]) == "curl -H Authorization: Basic *** http://h/"
    assert mask_secrets("authorization=rawkey123 next") == "authorization=*** next"
    assert mask_secrets("a key sk-proj-ABCDEFGHIJKLMNOPQRSTUV in a log line") == "a key *** in a log line"
    for plain in ("--max-tokens 12 --token-budget 5", "--port 8000 -tp 2", "2026-12-03 INFO ready"):
        assert mask_secrets(plain) == plain


def test_a_hostile_command_line_is_masked_in_linear_time_and_stored_bounded():
    """Any local user chooses the command line of their GPU process (up to 2 MiB, 128 KiB an argument), and the agent
    masks it as root and stores it with every tick. Before: masking cost the square of a long
    word's length (``TOKENTOKEN…`` of 200 000 letters took 215 s of the agent's CPU, a long run
    of letters 10 s per 40 000) and the whole of it was stored each tick. Now masking is linear
    (this megabyte is masked in well under a second; the deadline only guards against a hang)
    and what is kept is at most ``COMMAND_LINE_LENGTH`` characters, secrets masked first."""
    from vgpumon.catalogue.host import COMMAND_LINE_LENGTH

    # in a child process: a regular expression holds the interpreter lock, no thread could time it
    hostile = """
from vgpumon.base.masking import mask_command_line
for argv in (["A" + "TOKEN" * 200_000, "=x"], ["--" + "token-" * 150_000, "x"], ["x" * 1_000_000, "a=b", "-c"]):
    print(len(mask_command_line(argv)))
"""
    done = subprocess.run([sys.executable, "-c", hostile], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["1000004", "900004", "1000007"]  # nothing in them to mask

    key = "sk-live-0123456789abcdefghij"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--api-key", key, "TOKEN" * 20_000, "x" * 100_000])
    try:
        info = _sampled_once_it_runs(proc, key)
        assert info.resolved and info.cmdline is not None
        assert len(info.cmdline) == COMMAND_LINE_LENGTH and info.cmdline.endswith("…")
        assert "--api-key *** TOKENTOKEN" in info.cmdline and key not in info.cmdline
    finally:
        proc.kill()
        proc.wait()
