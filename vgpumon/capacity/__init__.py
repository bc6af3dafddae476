"""``vgpumon capacity``: the PCIe headroom review before cards are added to a host.

Modules: ``review`` (the data, from the 1-minute rollups and the stored topology), ``render``
(rich tables), ``html`` (plots for review documents, the ``html`` extra). Decisions and the
figures' definitions: docs/capacity.md.
"""

from vgpumon.capacity.review import review, review_host

__all__ = ["review", "review_host"]
