"""The vLLM servers' series of ``/metrics``: each fresh server's state, telemetry, latency and
engine readings under the labels vLLM itself uses (``model_name``, ``engine``); a server whose
newest poll is older than three poll intervals is left out. They are read from the tick's
snapshot (``Snapshot.vllm``), never from the source. A part of ``MetricsExporter``."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from vgpumon.exporter import plans
from vgpumon.exporter.text import Family, Labels
from vgpumon.model import ServerSample, Snapshot, VllmServers


class VllmSeries:
    """The vLLM part of ``MetricsExporter``: what it reads of the exporter is declared here."""

    hostname: str
    #: wall − data time of the newest tick (a replay's, else 0): added to the times served
    _offset: float

    def _cached(self, key: tuple[Hashable, ...], make: Callable[[], Labels]) -> Labels:
        raise NotImplementedError  # MetricsExporter's

    def _server_base(self, smp: ServerSample) -> Labels:
        model = smp.model_names[0] if smp.model_names else ""
        server = f"{smp.instance.host}:{smp.instance.port}"
        return self._cached(
            ("server", server, model),
            lambda: Labels((("hostname", self.hostname), ("server", server), *((("model_name", model),) if model else ()))),
        )

    def _engine_labels(self, base: Labels, model: str | None, engine: str | None) -> Labels:
        # an engine series names its own model (LoRA adapters share one server)
        def make() -> Labels:
            items = dict(base.items)
            if model:
                items["model_name"] = model
            if engine is not None:
                items["engine"] = engine
            return Labels(items.items())

        return self._cached(("engine", base.items, model, engine), make)

    def _servers(self, fams: dict[str, Family], snap: Snapshot, view: VllmServers) -> None:
        index = {g.uuid: g.index for g in snap.gpus}
        for smp in view.recent():
            base = self._server_base(smp)
            if (fam := fams.get(plans.SERVER_INFO)) is not None:
                fam.add(base.plus("version", smp.version) if smp.version else base, 1.0)
            if (fam := fams.get(plans.STATE)) is not None:
                for state in plans.STATES:
                    fam.add(base.plus("state", state), 1.0 if smp.state.value == state else 0.0)
            if smp.telemetry is not None and (fam := fams.get(plans.TELEMETRY_UP)) is not None:
                fam.add(base, 0.0 if smp.telemetry == "down" else 1.0)
            if smp.telemetry is not None and (fam := fams.get(plans.TELEMETRY.prometheus)) is not None:  # type: ignore[arg-type]
                for value in (plans.TELEMETRY.decode or {}).values():
                    fam.add(base.plus("telemetry", value), 1.0 if smp.telemetry == value else 0.0)
            flagged = smp.latency_unreliable or {}
            if (fam := fams.get(plans.UNRELIABLE.prometheus)) is not None:  # type: ignore[arg-type]
                for histogram in (plans.UNRELIABLE.decode or {}).values():
                    fam.add(base.plus("histogram", histogram), 1.0 if histogram in flagged else 0.0)
            if flagged:
                # percentiles of a histogram that cannot be true are not served: a latency alert
                # must never fire from them (they are stored, flagged, with the reason)
                hidden = frozenset().union(*(plans.LATENCY_FIELDS.get(h, ()) for h in flagged))
                plans.add_values(fams, base, smp, tuple(p for p in plans.VLLM if p[0] not in hidden))
            else:
                plans.add_values(fams, base, smp, plans.VLLM)
            plans.add_values(fams, base, smp, plans.INSTANCE)
            for e in smp.engines:
                plans.add_values(fams, self._engine_labels(base, e.model_name, e.engine), e, plans.ENGINE)
            if smp.ready_ts is not None and (fam := fams.get(plans.READY)) is not None:
                fam.add(base, smp.ready_ts + self._offset)  # on the wall clock, as the source statuses
            if (fam := fams.get(plans.SERVER_GPU)) is not None:
                for uuid in smp.gpu_uuids:
                    gpu = index.get(uuid)
                    fam.add(
                        self._cached(
                            ("sgpu", base.items, uuid, gpu),
                            lambda: Labels((*base.items, ("uuid", uuid), *((("gpu", str(gpu)),) if gpu is not None else ()))),  # noqa: B023  the factory runs at once, inside this iteration (_cached)
                        ),
                        1.0,
                    )
