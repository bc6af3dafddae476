"""Cannot judge, or not applicable (issue 24): a rule whose input is optional data this host simply
does not have says "not applicable", never "cannot judge", which is for data that should be there
and is not (docs/rules.md). The recorded H200 capture made into a board without GPM, ECC or row
remapping (those calls answer NOT_SUPPORTED from the start, as on a consumer card), replayed and
diagnosed: the GPM, ECC and straggler rules are listed as not applicable, the memory area is N/A
rather than UNKNOWN, and none of them is among the rules that could not judge."""

from __future__ import annotations

import json

import pytest
from conftest import H200_CAPTURE, vgpumon

from vgpumon.sources.nvml.backend import NVML_ERROR_NOT_SUPPORTED
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes: not in the quick subset (docs/testing.md)

#: the rules that cannot apply to such a board, one GPU alone on its host
NOT_APPLICABLE = {"GpuStuck", "GpuMemoryHeldIdle", "GpuEccUncorrectable", "GpuRowRemapFailed", "GpuRowRemapPending",
                  "GpuRemappedRowsHigh", "GpuStraggler"}


run = vgpumon


def test_a_board_without_gpm_or_ecc_says_not_applicable_not_cannot_judge(tmp_path):
    header, ticks = read_capture(H200_CAPTURE)
    for fn in ("nvmlGpmQueryDeviceSupport", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"):
        header, ticks = scenarios.fail_call(header, ticks, fn, NVML_ERROR_NOT_SUPPORTED, from_tick=-1)
    cap = tmp_path / "consumer.jsonl"
    scenarios.write(cap, header, ticks)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run("agent", "--listen", "off", "--replay", str(cap), "--db", url).returncode == 0
    out = run("diagnose", "localhost", "--db", url, "--json")
    (gpu,) = json.loads(out.stdout)["gpus"]
    assert set(gpu["rules_not_applicable"]) == NOT_APPLICABLE, gpu["rules_not_applicable"]
    assert all(why.startswith("not applicable: ") for why in gpu["rules_not_applicable"].values())
    assert NOT_APPLICABLE.isdisjoint(gpu["rules_unknown"]), gpu["rules_unknown"]
    memory = gpu["health"]["memory"]
    assert memory["status"] == "N/A" and "no ECC" in memory["reason"], memory
    assert gpu["health"]["readable"]["status"] == "PASS"  # GpuStuck does not apply; the others judged it readable
    text = run("diagnose", "localhost", "--db", url).stdout
    assert "Not applicable here: " in text and "GpuEccUncorrectable (GPU 0)" in text, text
    judged = text.split("Rules that could not judge", 1)[1].split("Not applicable here", 1)[0] if "Rules that could not judge" in text else ""
    assert not any(rule in judged for rule in NOT_APPLICABLE), judged
