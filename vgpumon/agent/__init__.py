"""The agent: the daemon that samples every source each tick and feeds the store, ``/metrics``
and the rules. One job a module:

- ``scheduler``: ``Agent``, which composes the parts below and runs them (start, the replay
  loop, stop);
- ``sampler``: the paced sampler and its watchdog (SIGALRM timer, or a thread);
- ``writer``: the store writer (batches, backlog, dead letters, retention, silent store);
- ``rows``: a snapshot encoded as the store's rows;
- ``tasks``: supervision of the vLLM source and the kubelet's attribution;
- ``stats``: what a run did;
- ``process``: the lean process ``vgpumon agent`` execs into, and its typed plan.
"""

from vgpumon.agent.sampler import quiet_wakeup_fd
from vgpumon.agent.scheduler import Agent
from vgpumon.agent.stats import AgentStats
from vgpumon.agent.writer import LIVE_FLUSH_S, REPLAY_FLUSH_S, STOP_GRACE_S

__all__ = ["LIVE_FLUSH_S", "REPLAY_FLUSH_S", "STOP_GRACE_S", "Agent", "AgentStats", "quiet_wakeup_fd"]
