"""NVML's lifecycle: initialisation and re-initialisation with back-off, the devices found and
identified, a library or device that goes away and comes back."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from vgpumon import catalogue
from vgpumon.model import GpuIdentity, GpuSample
from vgpumon.sources.nvml.backend import NVML_ERROR_NOT_SUPPORTED, NvmlCallError
from vgpumon.sources.nvml.constants import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    DeviceDown,
    _describe,
)

if TYPE_CHECKING:
    from vgpumon.sources.nvml.backend import NvmlBackend
    from vgpumon.sources.nvml.reads import _Reader, _Unsupported

log = logging.getLogger("vgpumon.sources.nvml")


class Lifecycle:
    """Starts NVML, identifies the devices and brings them back (a part of ``NvmlSource``)."""

    # what it uses of NvmlSource (set there)
    backend: NvmlBackend
    gpus: tuple[GpuIdentity, ...]
    driver_version: str | None
    use_gpm: bool
    max_backoff_ticks: int
    _tick: int
    _device_count: int | None
    _named_once: bool
    _unsupported: dict[int, _Unsupported]
    _mem_api: dict[int, str]
    _down: dict[int, tuple[str, int, int]]
    _lib_down: tuple[str, int, int] | None
    _unidentified: dict[int, tuple[str, int, int]]

    if TYPE_CHECKING:  # NvmlSource's (stubs here would shadow it in the method order)

        def _event(self, kind: str, subject: str, detail: str = "") -> None: ...

        def _reader(self, index: int, gpu: GpuIdentity | None = None) -> _Reader: ...

    def _backoff(self, failures: int) -> int:
        return min(2 ** max(failures - 1, 0), self.max_backoff_ticks)

    def _init(self, why: str = "") -> None:
        """(Re-)initialise NVML and name every device (``why``: what made a re-initialisation). Answers cached as "not supported" and
        the memory API in use are forgotten: a driver reload or upgrade may answer them now."""
        self.backend.init()
        count = int(self.backend.system("nvmlDeviceGetCount"))
        try:
            self.driver_version = str(self.backend.system("nvmlSystemGetDriverVersion"))
        except NvmlCallError:
            self.driver_version = None
        self._unsupported.clear()
        self._mem_api.clear()
        self._device_count = count
        before = {g.uuid: g for g in self.gpus}
        first = not self._named_once  # the first set named is the baseline, not an arrival
        gpus = []
        self._unidentified.clear()
        for index in range(count):
            gpu = self._identify(index, max(self._tick - 1, 0))
            if gpu is not None:
                gpus.append(gpu)
                self._down.pop(index, None)
        self.gpus = tuple(gpus)
        self._named_once = True
        if not first:
            self._event("nvml_reinitialized", "host", f"{why}; {len(self.gpus)} GPU(s)")
            self._compare_device_sets(before)

    def _identify(self, index: int, tick: int = 0) -> GpuIdentity | None:
        """Name one device; one that cannot be named is retried with back-off from ``tick``
        (``None``)."""
        try:
            gpu = self._identity(index)
        except DeviceDown as exc:
            prev = self._unidentified.get(index)
            failures = 1 if prev is None else prev[1] + 1
            if prev is None:
                log.warning("GPU %d cannot be identified: %s; retrying with back-off", index, exc.error.reason)
                self._event("gpu_unidentified", f"index:{index}", exc.error.reason)
            self.backend.forget_device(index)
            self._unidentified[index] = (exc.error.reason, failures, tick + self._backoff(failures))
            return None
        if self._unidentified.pop(index, None) is not None:
            log.warning("GPU %d identified after retries: %s", index, gpu.uuid)
        return gpu

    def _compare_device_sets(self, before: dict[str, GpuIdentity]) -> None:
        now = {g.uuid: g for g in self.gpus}
        for uuid in sorted(now.keys() - before.keys(), key=lambda u: now[u].index):
            log.warning("GPU %d (%s) appeared", now[uuid].index, uuid)
            self._event("gpu_appeared", f"gpu:{uuid}", f"index {now[uuid].index}, bus {now[uuid].pci_bus_id}")
        for uuid in sorted(before.keys() - now.keys(), key=lambda u: before[u].index):
            log.warning("GPU %d (%s) is gone", before[uuid].index, uuid)
            self._event("gpu_disappeared", f"gpu:{uuid}", f"was index {before[uuid].index}, bus {before[uuid].pci_bus_id}")

    def _retry_unidentified(self, tick: int) -> None:
        """Devices that could not be named (at start, or after a re-initialisation) are retried
        with back-off; one named at last joins the sampled GPUs as an appeared GPU."""
        for index, (_, _, due) in sorted(self._unidentified.items()):
            if tick >= due:
                gpu = self._identify(index, tick)
                if gpu is not None:
                    before = {g.uuid: g for g in self.gpus}
                    self.gpus = tuple(sorted((*self.gpus, gpu), key=lambda g: g.index))
                    self._compare_device_sets(before)

    def _check_device_count(self, tick: int) -> None:
        """Slow period: re-read the device count; a changed count re-initialises NVML (its device
        list is fixed at nvmlInit), which names the new set and stores what appeared or went."""
        try:
            count = int(self.backend.system("nvmlDeviceGetCount"))
        except (NvmlCallError, TypeError, ValueError):
            return  # not answered (or not in a capture): the next slow tick asks again
        if self._device_count is not None and count != self._device_count:
            log.warning("NVML now counts %d GPU(s), was %d: re-initialising", count, self._device_count)
            self._reinitialise(tick, f"device count {self._device_count} → {count}")

    def _reinitialise(self, tick: int, why: str) -> None:
        self.backend.shutdown()
        try:
            self._init(why)
        except NvmlCallError as exc:
            self._library_failed(tick, exc)

    def _reprobe(self) -> None:
        """Forget the cached "not supported" answers so they are asked again."""
        for index, cached in self._unsupported.items():
            if cached:
                calls = ", ".join(sorted({key[0] for key in cached}))
                log.info("GPU %d: re-probing %d call(s) cached as not supported: %s", index, len(cached), calls)
                cached.clear()

    def _identity(self, index: int) -> GpuIdentity:
        r = self._reader(index)
        v: dict[str, Any] = {}  # GpuIdentity's keyword arguments, as the door admitted them
        r.put("uuid", r.q("uuid", "nvmlDeviceGetUUID"), v)
        if "uuid" not in v:  # no identity, no history: the device is treated as down
            raise DeviceDown(NvmlCallError(NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetUUID"))
        pci = r.q("pci_bus_id", "nvmlDeviceGetPciInfo")
        r.put("pci_bus_id", r.get("pci_bus_id", pci, "busId") or None, v)
        r.put("memory_total_bytes", r.get("memory_total_bytes", r.q("memory_total_bytes", "nvmlDeviceGetMemoryInfo"), "total"), v)
        gpm_supported = False
        if self.use_gpm:
            support = r.q("gpm", "nvmlGpmQueryDeviceSupport")
            gpm_supported = bool(isinstance(support, dict) and support.get("isSupportedDevice"))
        r.put("name", r.q("name", "nvmlDeviceGetName"), v)
        r.put("serial", r.q("serial", "nvmlDeviceGetSerial"), v)
        r.put("pcie_link_gen_max", r.q("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"), v)
        r.put("pcie_link_width_max", r.q("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"), v)
        r.put("pcie_link_gen_gpu_max", r.q("pcie_link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"), v)
        r.put("sm_clock_max_hertz", r.q("sm_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM), v, 1e6)
        r.put("memory_clock_max_hertz", r.q("memory_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM), v, 1e6)
        r.put(
            "slowdown_temperature_celsius",
            r.q("slowdown_temperature_celsius", "nvmlDeviceGetTemperatureThreshold", NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            v,
        )
        for field, reason in r.missing.items():
            if catalogue.is_rejection(reason):
                log.warning("GPU %d: %s %s", index, field, reason)
        return GpuIdentity(index=index, gpm_supported=gpm_supported, **v)

    def _library_failed(self, tick: int, error: NvmlCallError) -> None:
        failures = 1 if self._lib_down is None else self._lib_down[1] + 1
        if self._lib_down is None:
            log.error("NVML down: %s; re-initialising with back-off", _describe(error))
            self._event("nvml_down", "host", _describe(error))
        self._lib_down = (_describe(error), failures, tick + self._backoff(failures))

    def _retry_library(self, tick: int) -> bool:
        """Re-initialise NVML if the back-off allows; True when it is usable again."""
        assert self._lib_down is not None
        reason, failures, due = self._lib_down
        if tick < due:
            return False
        self.backend.shutdown()
        try:
            self._init(f"after {failures} tries ({reason})")
        except NvmlCallError as exc:
            self._lib_down = (_describe(exc), failures + 1, tick + self._backoff(failures + 1))
            return False
        log.warning("NVML usable again after %d tries (%s); %d GPU(s)", failures, reason, len(self.gpus))
        self._lib_down = None
        return True

    @staticmethod
    def _down_sample(gpu: GpuIdentity, ts: float, reason: str) -> GpuSample:
        return GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, up=False, missing={"*": reason})
