"""What an XID means and what to do about it: our own table, per code, for the report and the rules.

Source: NVIDIA's Xid catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors,
"Analyzing Xid Errors with the Xid Catalog"): each code's mnemonic and its *resolution bucket*
(the immediate action NVIDIA recommends: ``RESTART_APP``, ``RESET_GPU``, ``RESTART_BM`` — reboot
the node —, ``IGNORE``, or a named workflow such as ``WORKFLOW_XID_48``). The meanings and the
actions below are ours, written for the on-call engineer, and agree with those buckets. How
severe a code is for paging is decided elsewhere, by the rules' allowlists (FACTS §4 and §7:
``vgpumon.rules.gpu.CRITICAL_XIDS`` and ``WARNING_XIDS``); a code's bucket says what to do once
it happened.

Pure data, like the rest of the catalogue: no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where NVIDIA's catalog is, for codes this table does not hold.
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/"


@dataclass(frozen=True, slots=True)
class Xid:
    """One XID code.

    Attributes:
        code: the number the driver logs (``NVRM: Xid (PCI:…): 79, …``).
        mnemonic: the driver's name for it (``nverror.h``; the catalog's "Mnemonic").
        meaning: what happened, in a few words.
        bucket: NVIDIA's immediate resolution bucket for the code.
        action: what the on-call engineer does next, in our words.
        by_application: the code is usually raised by the application (a fault in its kernel,
            an illegal address), not by the GPU; the GPU is normally fine.
    """

    code: int
    mnemonic: str
    meaning: str
    bucket: str
    action: str
    by_application: bool = False


_RESTART_APP = "restart the application; if it repeats, hand it to its owners (it is their bug, not the GPU's)"
_RESET = "drain the GPU, then reset it (nvidia-smi -r -i <gpu>) or reboot; open a hardware case if it repeats"
_GSP = "drain the GPU and reset it (or reboot); update the driver if it repeats, then open a case"

XIDS: dict[int, Xid] = {
    x.code: x
    for x in (
        Xid(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing (a channel timed out)", "RESTART_APP",
            "restart the application; if it repeats on this GPU only, drain and reset it"),
        Xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (usually the application)", "RESTART_APP",
            _RESTART_APP, by_application=True),
        Xid(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
            "GPU memory page fault (usually an illegal access by the application)", "RESTART_APP", _RESTART_APP,
            by_application=True),
        Xid(32, "ROBUST_CHANNEL_PBDMA_ERROR", "invalid or corrupted push buffer stream", "RESTART_APP",
            "restart the application; if several applications raise it, check the PCIe link (replays) and the host's memory"),
        Xid(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
            "GPU stopped processing (a channel was reset; usually the application)", "IGNORE",
            "nothing on the GPU: the faulting application's channel was reset; tell its owners if it repeats",
            by_application=True),
        Xid(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup after earlier errors", "WORKFLOW_XID_45",
            "look at the XID that came before it; on its own it follows a process being killed"),
        Xid(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU timeout", "RESET_GPU", _RESET),
        Xid(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit ECC error", "WORKFLOW_XID_48",
            "drain the GPU and reset it; check the volatile ECC counts and row remapping; a hardware case if it repeats"),
        Xid(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint", "UNEXPECTED_ERR_REPORT_ISSUE",
            "drain and reset the GPU; report it to NVIDIA support with an nvidia-bug-report"),
        Xid(62, "PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", _RESET),
        Xid(63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row remapping recorded", "IGNORE",
            "nothing now; reset the GPU at the next window so that a pending remap takes effect"),
        Xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row remapping failed to record", "RESET_GPU",
            "drain the GPU and reset it; plan a replacement (its memory can no longer be repaired in place)"),
        Xid(74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR",
            "drain the GPU and reset it (with its NVLink peers); check the NVLink error counters; a hardware case if it repeats"),
        Xid(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM",
            "drain the host's work from the GPU and reboot the node (a GPU reset cannot reach it); "
            "if it recurs, reseat the card and check the slot's power and riser"),
        Xid(92, "EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", "IGNORE",
            "nothing now (the errors were corrected); watch the corrected ECC counts, plan a replacement if they climb"),
        Xid(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "contained ECC error", "RESTART_APP",
            "restart the application that was stopped; reset the GPU at the next window; drain it if 94 repeats"),
        Xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained ECC error", "RESET_GPU",
            "drain the GPU and reset it now: every application on it may have read corrupted memory"),
        Xid(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", "RESET_GPU", _RESET),
        Xid(119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", "RESET_GPU", _GSP),
        Xid(120, "GSP_ERROR", "GSP error", "RESET_GPU", _GSP),
        Xid(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC error", "RESET_GPU",
            "drain the GPU and reset it now; check the ECC counts; a hardware case if it repeats"),
        Xid(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed (reset or reboot required)", "FOLLOW_MESSAGE",
            "do what the driver's message asks (reset the GPU, reboot, or drain and reset)"),
    )
}


def describe(code: int) -> Xid:
    """The table's entry for ``code``, or a placeholder that points at NVIDIA's catalog.

    Args:
        code: an XID code as the driver logged it.

    Returns:
        An ``Xid``; for a code outside the table its mnemonic is ``""``, its bucket ``"UNKNOWN"``
        and its meaning and action say to look it up.
    """
    found = XIDS.get(code)
    if found is not None:
        return found
    return Xid(code, "", "not in vgpumon's table", "UNKNOWN", f"look the code up in NVIDIA's Xid catalog ({CATALOG_URL})")
