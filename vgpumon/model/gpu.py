"""GPU and host data: what one tick saw, in base units.

Units: seconds, bytes, bytes/s, ratio 0–1, celsius, watts, joules, hertz. ``None`` always means
"not known" (not supported, no permission, error, device down, not sampled this tick); the reason
for each ``None`` that is not simply "not sampled this tick" is in ``GpuSample.missing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

_new = object.__new__

if TYPE_CHECKING:
    from vgpumon.model.kubernetes import KubernetesAttribution
    from vgpumon.model.vllm import VllmServers


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Static facts of one GPU, read once at start and after a re-initialisation.

    Attributes:
        index: NVML device index (``nvmlDeviceGetHandleByIndex``); not stable across reboots.
        uuid: ``nvmlDeviceGetUUID`` (nvidia-smi ``uuid``); the identity used in the store.
        name: ``nvmlDeviceGetName`` (nvidia-smi ``name``), e.g. ``"NVIDIA H200"``.
        serial: ``nvmlDeviceGetSerial`` (nvidia-smi ``serial``); ``None`` on boards without one.
        pci_bus_id: ``nvmlDeviceGetPciInfo().busId`` (nvidia-smi ``pci.bus_id``).
        memory_total_bytes: ``nvmlDeviceGetMemoryInfo`` total.
        pcie_link_gen_max: max generation of device ∧ slot (``nvmlDeviceGetMaxPcieLinkGeneration``).
        pcie_link_width_max: max width of device ∧ slot (``nvmlDeviceGetMaxPcieLinkWidth``).
        pcie_link_gen_gpu_max: max generation of the device alone
            (``nvmlDeviceGetGpuMaxPcieLinkGeneration``); above ``pcie_link_gen_max`` means the
            card sits in a slower slot.
        gpm_supported: ``nvmlGpmQueryDeviceSupport`` (Hopper and later).
        sm_clock_max_hertz: ``nvmlDeviceGetMaxClockInfo(SM)`` MHz × 1e6 (``clocks.max.sm``).
        memory_clock_max_hertz: ``nvmlDeviceGetMaxClockInfo(MEM)`` MHz × 1e6 (``clocks.max.mem``).
        slowdown_temperature_celsius: ``nvmlDeviceGetTemperatureThreshold(SLOWDOWN)`` °C: where this
            GPU's driver starts to slow its clocks (nvidia-smi ``-q`` "GPU Slowdown Temp"); ``None``
            where the board does not report it.
    """

    index: int
    uuid: str
    name: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width_max: int | None = None
    pcie_link_gen_gpu_max: int | None = None
    gpm_supported: bool = False
    sm_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    slowdown_temperature_celsius: float | None = None


@dataclass
class GpuSample:
    """What one tick read from one GPU.

    Treat as immutable (``dataclasses.replace`` makes a changed copy): it is not declared frozen
    because a frozen dataclass of this width costs four times as much to build (about 19 µs
    against 4 µs here, once per GPU per tick: a tenth of the fast set's own cost). The collector
    builds it with ``GpuSample.of``, cheaper still; that is also why it has no ``__slots__``.

    Fast fields are read every tick; slow fields (ECC) only every ``slow_every`` ticks and the
    minute set (energy, BAR1, ...) each minute; they are ``None`` on the other ticks (``missing``
    does not name them then).

    Attributes:
        ts: tick time, seconds since the Unix epoch (UTC).
        uuid: the GPU (see ``GpuIdentity.uuid``).
        up: False when the device could not be read at all this tick (lost, reset, ...).
        activity_source: ``"gpm"`` when SM figures come from GPM, ``"utilization"`` when the
            device has no GPM and ``utilization_gpu_ratio`` is the only activity proxy.
        memory_used_bytes: memory v2 ``used`` (excludes driver-reserved memory); with only v1
            available it is v1 ``used``, which includes the reserved part.
        memory_reserved_bytes: memory v2 ``reserved``; ``None`` with v1.
        memory_total_bytes: memory ``total``.
        utilization_gpu_ratio: ``nvmlDeviceGetUtilizationRates().gpu`` / 100 (nvidia-smi
            ``utilization.gpu``): share of time *any* kernel or copy ran — not SM activity.
        utilization_memory_ratio: ``nvmlDeviceGetUtilizationRates().memory`` / 100.
        sm_active_ratio: GPM ``SM_UTIL`` / 100 (DCGM ``SM_ACTIVE``), averaged over the tick.
        sm_occupancy_ratio: GPM ``SM_OCCUPANCY`` / 100 (DCGM ``SM_OCCUPANCY``).
        tensor_active_ratio: GPM ``ANY_TENSOR_UTIL`` / 100 (DCGM ``PIPE_TENSOR_ACTIVE``).
        dram_active_ratio: GPM ``DRAM_BW_UTIL`` / 100 (DCGM ``DRAM_ACTIVE``).
        pcie_tx_bytes_per_second: GPM ``PCIE_TX_PER_SEC`` (MiB/s × 2**20), averaged over the tick.
        pcie_rx_bytes_per_second: GPM ``PCIE_RX_PER_SEC`` (MiB/s × 2**20), averaged over the tick.
        pcie_link_gen_current: ``nvmlDeviceGetCurrPcieLinkGeneration`` (down-trains when idle).
        pcie_link_width_current: ``nvmlDeviceGetCurrPcieLinkWidth``.
        temperature_celsius: ``nvmlDeviceGetTemperature(GPU)`` (nvidia-smi ``temperature.gpu``).
        power_watts: ``nvmlDeviceGetPowerUsage`` mW / 1000 (nvidia-smi ``power.draw``).
        sm_clock_hertz: ``nvmlDeviceGetClockInfo(SM)`` MHz × 1e6 (nvidia-smi ``clocks.sm``).
        memory_clock_hertz: ``nvmlDeviceGetClockInfo(MEM)`` MHz × 1e6 (``clocks.mem``).
        clocks_event_reasons: ``nvmlDeviceGetCurrentClocksEventReasons`` bitmask.
        performance_state: ``nvmlDeviceGetPerformanceState`` (P0 = 0 … P15; nvidia-smi ``pstate``).
        fan_speed_ratio: ``nvmlDeviceGetFanSpeed`` / 100; ``None`` on passively cooled boards.
        ecc_*: ``nvmlDeviceGetTotalEccErrors(type, counter)``; volatile counts since the last
            driver load, aggregate over the board's life (slow set). ``*_dram_*``/``*_sram_*``:
            ``nvmlDeviceGetMemoryErrorCounter`` by location where the board exports it.
        bar1_used_bytes, bar1_total_bytes: ``nvmlDeviceGetBAR1MemoryInfo`` (minute set).
        pcie_replay_total: ``nvmlDeviceGetPcieReplayCounter`` (minute set).
        remapped_rows_*: ``nvmlDeviceGetRemappedRows`` (Ampere and later; slow set).
        retired_pages_*: ``nvmlDeviceGetRetiredPages`` / ``...PendingStatus`` (pre-Ampere).
        power_limit_watts: ``nvmlDeviceGetEnforcedPowerLimit`` mW / 1000 (``enforced.power.limit``).
        violation_power_seconds_total, violation_thermal_seconds_total:
            ``nvmlDeviceGetViolationStatus(POWER / THERMAL)`` ns / 1e9 (minute set).
        persistence_mode, compute_mode, mig_mode: ``nvmlDeviceGetPersistenceMode``,
            ``nvmlDeviceGetComputeMode`` (slow set), ``nvmlDeviceGetMigMode`` current (minute set).
        energy_joules_total: ``nvmlDeviceGetTotalEnergyConsumption`` mJ / 1000 since driver load
            (minute set: once a minute).
        memory_temperature_celsius: HBM temperature, ``nvmlDeviceGetFieldValues`` field 82
            (``NVML_FI_DEV_MEMORY_TEMP``; nvidia-smi ``temperature.memory``).
        pcie_replay_rate_per_second: increase of ``pcie_replay_total`` per second since the
            previous slow read; ``None`` on the first read and after a counter reset.
        xid_counts: XID code → events seen on this GPU since the agent started.
        xid_last_seen: XID code → time of the newest such event (epoch seconds).
        processes: ``(pid, used_bytes or None)`` per compute process
            (``nvmlDeviceGetComputeRunningProcesses``); host PIDs.
        missing: field name → reason it is ``None`` (``"not supported"``, ``"no permission"``,
            ``"device down: GPU is lost"``, ``"rejected: out of range"``, ...).
    """

    ts: float
    uuid: str
    index: int
    up: bool = True
    activity_source: str | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_gen_current: int | None = None
    pcie_link_width_current: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clocks_event_reasons: int | None = None
    ecc_corrected_volatile_total: int | None = None
    ecc_uncorrected_volatile_total: int | None = None
    ecc_corrected_aggregate_total: int | None = None
    ecc_uncorrected_aggregate_total: int | None = None
    energy_joules_total: float | None = None
    performance_state: int | None = None
    fan_speed_ratio: float | None = None
    ecc_corrected_volatile_dram_total: int | None = None
    ecc_uncorrected_volatile_dram_total: int | None = None
    ecc_corrected_volatile_sram_total: int | None = None
    ecc_uncorrected_volatile_sram_total: int | None = None
    bar1_used_bytes: int | None = None
    bar1_total_bytes: int | None = None
    pcie_replay_total: int | None = None
    remapped_rows_correctable_total: int | None = None
    remapped_rows_uncorrectable_total: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_single_bit_total: int | None = None
    retired_pages_double_bit_total: int | None = None
    retired_pages_pending: bool | None = None
    power_limit_watts: float | None = None
    violation_power_seconds_total: float | None = None
    violation_thermal_seconds_total: float | None = None
    persistence_mode: bool | None = None
    compute_mode: int | None = None
    mig_mode: int | None = None
    pcie_replay_rate_per_second: float | None = None
    memory_temperature_celsius: float | None = None
    xid_counts: Mapping[int, int] = field(default_factory=dict)
    xid_last_seen: Mapping[int, float] = field(default_factory=dict)
    processes: tuple[tuple[int, int | None], ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, ts: float, uuid: str, index: int, missing: Mapping[str, str], values: dict[str, Any]) -> "GpuSample":
        """The per-tick constructor: a sample whose fields are ``values`` (field name → value,
        names of this class only; not checked), the others their defaults.

        ``values`` is handed over, not copied: it becomes the sample's attributes (the caller
        keeps no reference). About 0.25 µs where ``__init__``, which sets each of the ~56 fields,
        takes 1.6 µs (once per GPU per tick; docs/benchmarks.md, "Agent footprint")."""
        values["ts"], values["uuid"], values["index"], values["missing"] = ts, uuid, index, missing
        if "xid_counts" not in values:
            values["xid_counts"] = {}
        if "xid_last_seen" not in values:
            values["xid_last_seen"] = {}
        sample = _new(cls)
        sample.__dict__ = values
        return sample


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID event: ``ts`` (epoch seconds, when the agent received it), GPU, XID code, and
    ``seq``, its number among the GPU's events since the agent started — three XID 31 in one
    millisecond are three events, and a replayed spool still stores each once."""

    ts: float
    uuid: str
    xid: int
    seq: int = 0


#: ``HostEvent.detail`` of a ``gpu_down`` event when NVML answered NVML_ERROR_GPU_IS_LOST ("the GPU
#: has fallen off the bus or has otherwise become inaccessible", nvml.h): the driver's own verdict,
#: which only a reset or a reboot undoes.
GPU_LOST_REASON = "GPU is lost"


@dataclass(frozen=True, slots=True)
class HostEvent:
    """Something that happened to the host or one of its GPUs, stored as it happened so that
    reports and rules can explain a gap or ignore a step (``host_events``).

    Attributes:
        ts: when the source noticed it (epoch seconds).
        kind: what happened — ``gpu_appeared``, ``gpu_disappeared``, ``gpu_unidentified`` (a
            device NVML counts but cannot name), ``gpu_down``, ``gpu_recovered``,
            ``gpu_wedged``, ``gpu_unwedged``, ``nvml_down``, ``nvml_reinitialized``,
            ``memory_api_changed``, ``clock_step``, ``collector_fault``.
        subject: ``gpu:<uuid>``, ``index:<n>`` for a device without a readable UUID, or ``host``.
        detail: the evidence in words (reason, old → new, seconds).
    """

    ts: float
    kind: str
    subject: str
    detail: str = ""


@dataclass(slots=True)  # built every tick: not frozen, see GpuSample
class SourceStatus:
    """Self-metrics of one source.

    Attributes:
        name: ``"nvml"``, ``"host"``, ``"vllm"``.
        up: the source answered this tick (for NVML: the library is usable; single devices can
            still be down, see ``GpuSample.up``).
        last_success_ts: newest tick the source answered (epoch seconds); ``None`` if never.
        collect_seconds: wall time the source spent on this tick.
        rejected: field → values rejected as impossible since the agent started.
        message: why the source is down, ``None`` when up.
    """

    name: str
    up: bool
    last_success_ts: float | None
    collect_seconds: float
    rejected: Mapping[str, int] = field(default_factory=dict)
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A process that holds GPU memory, as the host sees it (psutil, ``/proc``).

    Attributes:
        pid: host PID (as NVML reports it).
        resolved: False when the PID could not be looked up: gone before the look, or from
            another PID namespace (an agent in a container without ``hostPID``); the owner
            fields are then ``None`` and ``unresolved_reason`` says why.
        start_time: process start (epoch seconds); with ``pid`` it identifies the process.
        name, cmdline, username: ``psutil.Process`` name, command line (space-joined), user.
        container_id: container id from ``/proc/<pid>/cgroup`` (docker, containerd, CRI-O);
            ``None`` for a process outside containers.
        rss_bytes: resident set size — a leak that keeps request objects alive grows it too.
        cpu_seconds_total: user + system CPU time.
    """

    pid: int
    resolved: bool
    start_time: float | None = None
    name: str | None = None
    cmdline: str | None = None
    username: str | None = None
    container_id: str | None = None
    rss_bytes: int | None = None
    cpu_seconds_total: float | None = None
    unresolved_reason: str | None = None


@dataclass(frozen=True, slots=True)
class HostSample:
    """The host at one tick (psutil).

    Attributes:
        cpu_ratio: share of all CPUs busy since the previous sample (0–1); ``None`` on the first.
        memory_used_bytes: total − available (``psutil.virtual_memory``), i.e. memory that
            cannot be reclaimed without swapping.
        memory_total_bytes: physical memory.
        load1, load5, load15: load averages (``os.getloadavg``).
        processes: PID → ``ProcessInfo`` for every PID that holds GPU memory this tick.
        missing: field → why it is ``None`` where psutil answered something impossible
            (``rejected: …``; a process's figure names its pid in the reason).
    """

    ts: float
    cpu_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    processes: Mapping[int, ProcessInfo] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)  # built every tick: not frozen, see GpuSample
class NvmlReading:
    """What the NVML source returns for one tick."""

    ts: float
    samples: tuple[GpuSample, ...]
    xid_events: tuple[XidEvent, ...] = ()
    status: SourceStatus | None = None
    events: tuple[HostEvent, ...] = ()
    vllm: VllmServers | None = None


@dataclass(slots=True)  # built every tick: not frozen, see GpuSample
class Snapshot:
    """Everything one tick saw on one host.

    Attributes:
        ts: tick time, seconds since the Unix epoch (UTC).
        hostname: the host the agent runs for (its store identity).
        gpus: static facts, one per device found at the last (re)initialisation.
        samples: one ``GpuSample`` per device in ``gpus``, same order.
        xid_events: XID events received during this tick.
        sources: self-metrics of each source for this tick.
        host: the host sample (CPU, memory, GPU processes' owners), ``None`` when not taken.
        kubernetes: pod/namespace/container of the GPUs and GPU processes, from the kubelet
            (``vgpumon.sources.kubernetes.attach``); ``None`` off Kubernetes or without an answer.
        events: what happened during this tick (GPUs appearing or going, re-initialisations,
            clock steps, ...).
        vllm: the vLLM source's newest sample of each server at this tick
            (``VllmSource.attach``); ``None`` where no vLLM source runs.
    """

    ts: float
    hostname: str
    gpus: tuple[GpuIdentity, ...]
    samples: tuple[GpuSample, ...]
    xid_events: tuple[XidEvent, ...] = ()
    sources: tuple[SourceStatus, ...] = ()
    host: HostSample | None = None
    kubernetes: KubernetesAttribution | None = None
    events: tuple[HostEvent, ...] = ()
    vllm: VllmServers | None = None
