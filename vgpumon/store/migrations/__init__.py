"""Alembic migrations of the vgpumon store, shipped inside the package (see docs/store.md)."""
