"""Time-series store: schema, engine, repository."""

from vgpumon.store import vllm_schema  # noqa: F401  (registers the vLLM tables in schema.metadata)
from vgpumon.store.repository import Store, open_store
from vgpumon.store.tables import StoredGpu

__all__ = ["Store", "StoredGpu", "open_store"]
