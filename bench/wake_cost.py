"""CPU per wake-up of a sleeping Python thread (threading.Event.wait, Lock.acquire with a timeout,
time.sleep), 20 ticks a second for 20 s: python3 bench/wake_cost.py event|lock|sleep|itimer.

``itimer`` is ``lock`` plus what the agent's sampling thread pays per tick for its watchdog
timer: ``setitimer(ITIMER_REAL, 0.5)`` before the "read" and ``setitimer(ITIMER_REAL, 0)``
after (vgpumon.agent.Agent._arm/_disarm), with SIGALRM blocked in the thread as the agent does.
The difference between ``itimer`` and ``lock`` is the timer's cost per tick; a watchdog thread
costs one ``lock`` wake-up per tick instead. ``pairs``: 20 000 arm/disarm pairs back to back (the
timer's hot cost, no sleep). ``SECONDS_RUN`` (default 20) sets a run's length."""
import os
import signal
import sys
import threading
import time

mode = sys.argv[1]
seconds = float(os.environ.get("SECONDS_RUN", "20"))
ev = threading.Event()
lk = threading.Lock()
lk.acquire()
signal.signal(signal.SIGALRM, lambda *_: None)


def pairs():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    t0 = time.thread_time_ns()
    for _ in range(20000):
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        signal.setitimer(signal.ITIMER_REAL, 0)
    print("pairs 20000 %.2f us/pair (hot)" % ((time.thread_time_ns() - t0) / 20000 / 1e3))


def run():
    if mode == "pairs":
        return pairs()
    if mode == "itimer":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    tid = threading.get_native_id()
    t0 = int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if mode == "event":
            ev.wait(0.05)
        elif mode in ("lock", "itimer"):
            lk.acquire(timeout=0.05)
        else:
            time.sleep(0.05)
        if mode == "itimer":
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            signal.setitimer(signal.ITIMER_REAL, 0)
        n += 1
    t1 = int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
    print(mode, n, "%.1f us/wake" % ((t1 - t0) / n / 1e3))


t = threading.Thread(target=run)
t.start()
t.join()
