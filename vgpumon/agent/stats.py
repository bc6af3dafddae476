"""What a run of the agent did (``AgentStats``): counted by its parts, printed in the exit summary
and served on ``/metrics``."""



from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

log = logging.getLogger("vgpumon.agent")


@dataclass
class AgentStats:
    """What a run did.

    Attributes:
        ticks: ticks sampled.
        rows_written: GPU rows inserted into the store (spooled rows of earlier runs included).
        rows_duplicate: GPU rows skipped because the store held them already (a spool replayed
            after a restart, a capture replayed twice): reported apart, never as stored.
        rows_pending: rows held in memory at exit: lost (0 unless store and spool both failed).
        rows_spooled: rows left in the spool at exit; the next run replays them.
        rows_folded: raw ticks folded into 1-minute rollups because a backlog bound was reached
            (their full resolution is lost; the rollups are stored).
        outages: times the store became unreachable (or silent: see ``store_stalls``).
        store_stalls: times a store call went ``store_deadline`` seconds without an answer and the
            store's connections were cut (each also begins an outage when rows were in flight).
        gpus: GPUs found.
        vllm_samples: vLLM samples taken (one per server per poll).
        vllm_rows_folded: vLLM samples folded away while a backlog bound was reached (their
            server's state changes and last sample per minute are kept).
        vllm_restarts: times the vLLM source failed and was restarted.
        dead_letters: rows the store refused for what they hold, set aside in the dead-letter
            file beside the spool (``Backlog.dead_letter_path``) instead of being stored.
        ticks_skipped: slots of a paced run with no tick, because the tick before ran past them
            (a call slow but within ``call_deadline``, a starved host); logged.
    """

    ticks: int = 0
    rows_written: int = 0
    rows_duplicate: int = 0
    rows_pending: int = 0
    rows_spooled: int = 0
    rows_folded: int = 0
    outages: int = 0
    store_stalls: int = 0
    gpus: int = 0
    vllm_samples: int = 0
    vllm_rows_folded: int = 0
    vllm_restarts: int = 0
    dead_letters: int = 0
    ticks_skipped: int = 0
