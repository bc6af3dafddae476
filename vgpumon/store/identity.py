"""A host's identity and its GPUs in the store: registration (a GPU's history belongs to its host
and UUID) and the reads of who is there."""

from __future__ import annotations

import datetime as dt
import time
from typing import Iterable

from sqlalchemy import bindparam, select
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.model import GpuIdentity, GpuSample
from vgpumon.store.codec import GpuRow, encode_gpu_sample
from vgpumon.store.core import StoreBase
from vgpumon.store.schema import (
    Gpu,
    Host,
)
from vgpumon.store.tables import (
    GPUS_TTL_S,
    StoredGpu,
    _insert,
    insert_ignoring_duplicates,
)


class Registration(StoreBase):
    """Registers hosts and GPUs and answers who is stored (a part of ``Store``)."""

    def register_gpus(self, hostname: str, gpus: Iterable[GpuIdentity]) -> dict[str, int]:
        """Insert or update the host and its GPUs: idempotent upserts, so agents that start
        together (on one host name, or sharing GPU UUIDs) never collide.

        A GPU's history belongs to (host, UUID): a card seen on another host (moved, a cloned VM
        image, masked captures that share UUIDs) gets a row, and a history, of its own there.

        Returns:
            GPU UUID → ``gpus.id`` of this host's GPUs.
        """
        now = dt.datetime.now(dt.timezone.utc)
        t = Gpu.__table__
        self._gpus.pop(hostname, None)
        try:
            with self.engine.begin() as conn:
                conn.execute(insert_ignoring_duplicates(self.dialect, Host.__table__).values(hostname=hostname, first_seen=now))
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                ids: dict[str, int] = {}
                for g in gpus:
                    attrs = dict(
                        index=g.index,
                        name=g.name,
                        serial=g.serial,
                        pci_bus_id=g.pci_bus_id,
                        memory_total_bytes=g.memory_total_bytes,
                        pcie_link_gen_max=g.pcie_link_gen_max,
                        pcie_link_width_max=g.pcie_link_width_max,
                        pcie_link_gen_gpu_max=g.pcie_link_gen_gpu_max,
                        gpm_supported=g.gpm_supported,
                        sm_clock_max_hertz=g.sm_clock_max_hertz,
                        memory_clock_max_hertz=g.memory_clock_max_hertz,
                        slowdown_temperature_celsius=g.slowdown_temperature_celsius,
                        last_seen=now,
                    )
                    ins = _insert(self.dialect, t).values(host_id=host_id, uuid=g.uuid, first_seen=now, **attrs)
                    upsert = ins.on_conflict_do_update(
                        index_elements=[t.c.host_id, t.c.uuid], set_={k: ins.excluded[k] for k in attrs}
                    ).returning(t.c.id)
                    ids[g.uuid] = int(conn.execute(upsert).scalar_one())
            return ids
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        finally:
            self._gpus.pop(hostname, None)  # a list read meanwhile (another thread) is not kept either

    @staticmethod
    def sample_row(gpu_id: int, s: GpuSample) -> GpuRow:
        """The stored ``gpu_samples`` row of one sample (see ``codec.encode_gpu_sample``)."""
        return encode_gpu_sample(gpu_id, s)

    def host_id(self, hostname: str) -> int | None:
        """``hosts.id`` of a host name, ``None`` if unknown."""
        try:
            with self.engine.connect() as conn:
                return conn.scalar(select(Host.id).where(Host.hostname == hostname))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def hostnames(self) -> list[str]:
        """Every host in the store, sorted."""
        try:
            with self.engine.connect() as conn:
                self._require_tables(conn)
                return list(conn.scalars(select(Host.hostname).order_by(Host.hostname)))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def gpus_of(self, hostname: str) -> list[StoredGpu]:
        """The GPUs stored for a host, by NVML index. Kept for ``GPUS_TTL_S`` seconds (the agent's
        rules read it every cycle), and read again at once after this store registers GPUs."""
        cached = self._gpus.get(hostname)
        if cached is not None and time.monotonic() - cached[0] < GPUS_TTL_S:
            return list(cached[1])
        out = self._read_gpus_of(hostname)
        self._gpus[hostname] = (time.monotonic(), tuple(out))
        return out

    def _read_gpus_of(self, hostname: str) -> list[StoredGpu]:
        try:
            with self.engine.connect() as conn:
                if not self._schema_ok:
                    self._require_tables(conn)
                stmt = self._stmt(("gpus_of",), lambda: select(Gpu.__table__).join(Host.__table__, Host.id == Gpu.host_id)
                                  .where(Host.hostname == bindparam("hostname")).order_by(Gpu.index))
                rows = conn.execute(stmt, {"hostname": hostname}).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        out = []
        for g in rows:
            out.append(
                StoredGpu(
                    id=g["id"],
                    hostname=hostname,
                    identity=GpuIdentity(
                        index=g["index"],
                        uuid=g["uuid"],
                        name=g["name"],
                        serial=g["serial"],
                        pci_bus_id=g["pci_bus_id"],
                        memory_total_bytes=g["memory_total_bytes"],
                        pcie_link_gen_max=g["pcie_link_gen_max"],
                        pcie_link_width_max=g["pcie_link_width_max"],
                        pcie_link_gen_gpu_max=g["pcie_link_gen_gpu_max"],
                        gpm_supported=bool(g["gpm_supported"]),
                        sm_clock_max_hertz=g["sm_clock_max_hertz"],
                        memory_clock_max_hertz=g["memory_clock_max_hertz"],
                        slowdown_temperature_celsius=g["slowdown_temperature_celsius"],
                    ),
                )
            )
        return out
