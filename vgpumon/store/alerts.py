"""Writes and reads of the ``alerts`` table (``schema.AlertRow``), on SQLite and Postgres alike."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypedDict

from sqlalchemy import ColumnElement, Engine, RowMapping, and_, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.model import Alert
from vgpumon.store.engine import unavailable
from vgpumon.store.schema import AlertRow, Host
from vgpumon.store.tables import inserted_id

_T = AlertRow.__table__


class AlertValues(TypedDict):
    """The ``alerts`` columns of one episode as written (``labels`` as JSON; times in epoch seconds)."""

    host_id: int
    name: str
    severity: str
    fingerprint: str
    labels: str
    state: str
    active_since: float
    fired_at: float | None
    resolved_at: float | None
    last_eval: float
    value: float | None
    summary: str
    description: str


def _row(host_id: int, a: Alert) -> AlertValues:
    return {
        "host_id": host_id, "name": a.name, "severity": a.severity, "fingerprint": a.fingerprint,
        "labels": json.dumps(a.labels, sort_keys=True), "state": a.state, "active_since": a.active_since,
        "fired_at": a.fired_at, "resolved_at": a.resolved_at, "last_eval": a.last_eval, "value": a.value,
        "summary": a.summary[:255], "description": a.description,
    }


def _alert(r: RowMapping) -> Alert:
    return Alert(
        name=r["name"], severity=r["severity"], labels=json.loads(r["labels"]), state=r["state"],
        active_since=r["active_since"], last_eval=r["last_eval"], summary=r["summary"], description=r["description"],
        value=r["value"], fired_at=r["fired_at"], resolved_at=r["resolved_at"], id=r["id"],
    )


class AlertRepository:
    """The alerts of a store.

    Args:
        engine: the store's engine (``Store.engine``); the table is created by the migrations.

    Every method raises ``StoreUnavailableError`` when the database cannot be reached.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _fail(self, exc: Exception) -> StoreUnavailableError:
        return unavailable(self.engine, exc)

    def save(self, hostname: str, alerts: Sequence[Alert], dropped: Sequence[Alert] = ()) -> None:
        """Store alert episodes in one transaction: insert new ones (their ``id`` is set), update
        known ones, delete ``dropped`` pending episodes (they never fired)."""
        if not alerts and not dropped:
            return
        try:
            with self.engine.begin() as conn:
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                if host_id is None:
                    host_id = inserted_id(conn.execute(Host.__table__.insert().values(hostname=hostname)).inserted_primary_key)
                for a in alerts:
                    row = _row(host_id, a)
                    if a.id is None:
                        a.id = conn.scalar(
                            select(_T.c.id).where(
                                and_(_T.c.host_id == host_id, _T.c.fingerprint == a.fingerprint, _T.c.active_since == a.active_since)
                            )
                        )
                    if a.id is None:
                        a.id = inserted_id(conn.execute(_T.insert().values(**row)).inserted_primary_key)
                    else:
                        conn.execute(_T.update().where(_T.c.id == a.id).values(**row))
                for a in dropped:
                    if a.id is not None:
                        conn.execute(_T.delete().where(_T.c.id == a.id))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def open_alerts(self, hostname: str) -> list[Alert]:
        """The host's pending and firing episodes (what an agent restores at start)."""
        return self._query(hostname, _T.c.state.in_(("pending", "firing")))

    def evaluated(self, hostname: str) -> tuple[int, float | None]:
        """How many alert rows the host has and the newest evaluation one of them records: no
        rows means no agent evaluated this host's rules into this store."""
        try:
            with self.engine.connect() as conn:
                n, last = conn.execute(
                    select(func.count(), func.max(_T.c.last_eval)).select_from(_T)
                    .join(Host.__table__, Host.id == _T.c.host_id).where(Host.hostname == hostname)
                ).one()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return int(n), None if last is None else float(last)

    def history(self, hostname: str, start: float, end: float) -> list[Alert]:
        """Episodes that fired and were active at some time in ``[start, end]``, oldest first."""
        cond = and_(
            _T.c.fired_at.is_not(None),
            _T.c.active_since <= end,
            or_(_T.c.resolved_at.is_(None), _T.c.resolved_at >= start),
        )
        return self._query(hostname, cond)

    def _query(self, hostname: str, cond: ColumnElement[bool]) -> list[Alert]:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(_T).join(Host.__table__, Host.id == _T.c.host_id).where(and_(Host.hostname == hostname, cond))
                    .order_by(_T.c.active_since, _T.c.id)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [_alert(r) for r in rows]
