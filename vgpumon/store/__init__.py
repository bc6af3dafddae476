"""Time-series store: schema, engine, repository."""

from vgpumon.store.repository import Store, StoredGpu, open_store

__all__ = ["Store", "StoredGpu", "open_store"]
