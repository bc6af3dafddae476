"""Python stacks of running processes, by py-spy (``py-spy dump --pid N``): what a vLLM server is
doing right now, for ``diagnose --stacks``.

py-spy reads another process's memory through ``ptrace`` (``process_vm_readv``): the agent needs
the right to trace the server (root, ``CAP_SYS_PTRACE``, or the same user with
``kernel.yama.ptrace_scope`` 0). Each way this can fail is one clear line, never a traceback:
py-spy not installed, permission denied, the process gone, py-spy too slow. py-spy briefly stops
the process while it reads the stacks (milliseconds); the agent only runs it when its config
allows (``[api] stacks``) and a person asked (``diagnose --stacks``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from vgpumon.diagnose.schema import StackDump

#: How long one dump may take before it is abandoned (a large process, a slow unwinder).
DUMP_TIMEOUT_S = 10.0

_DENIED = ("permission denied", "operation not permitted", "ptrace", "eperm", "access denied")
_GONE = ("no such process", "process not found", "failed to find process", "no process")


def find_py_spy() -> str | None:
    """The py-spy executable: on ``PATH``, else beside this Python (the virtual environment vgpumon
    was installed into, where pip puts py-spy as vgpumon's dependency)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def dump(pid: int, *, py_spy: str | None = None, timeout: float = DUMP_TIMEOUT_S) -> StackDump:
    """Dump the Python stacks of one process.

    Args:
        pid: host PID (a discovered vLLM server or engine process).
        py_spy: the py-spy executable; ``None`` finds it (``find_py_spy``).
        timeout: seconds before the dump is abandoned.

    Returns:
        ``{"pid": pid, "text": stacks}`` on success, else ``{"pid": pid, "error": one line}``
        saying which of: py-spy not installed, permission denied (with what grants it), the
        process has exited, py-spy timed out, or py-spy failed (its first error line).
    """
    exe = py_spy if py_spy is not None else find_py_spy()
    if exe is None or not Path(exe).is_file():
        return {"pid": pid, "error": "py-spy not installed on this host (pip install py-spy into vgpumon's environment)"}
    if not _alive(pid):
        return {"pid": pid, "error": f"process {pid} has exited"}
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603  py-spy with a PID of a discovered vLLM process, no shell, fixed arguments
    except subprocess.TimeoutExpired:
        return {"pid": pid, "error": f"py-spy did not finish within {timeout:g} s"}
    except OSError as exc:
        return {"pid": pid, "error": f"py-spy could not be run: {exc.strerror or exc}"}
    if done.returncode == 0 and done.stdout.strip():
        return {"pid": pid, "text": done.stdout}
    message = (done.stderr or done.stdout).strip()
    low = message.lower()
    if not _alive(pid) or any(w in low for w in _GONE):
        return {"pid": pid, "error": f"process {pid} has exited"}
    if any(w in low for w in _DENIED):
        return {"pid": pid, "error": f"permission denied: py-spy needs ptrace rights over pid {pid} "
                                      "(run the agent as root or with CAP_SYS_PTRACE; in a container add SYS_PTRACE)"}
    first = next((line.strip() for line in message.splitlines() if line.strip()), f"exit status {done.returncode}")
    return {"pid": pid, "error": f"py-spy failed: {first}"}
