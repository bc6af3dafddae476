"""CPU per wake-up of a sleeping Python thread (threading.Event.wait, Lock.acquire with a timeout,
time.sleep), 20 ticks a second for 20 s: python3 bench/wake_cost.py event|lock|sleep."""
import threading, time, os, sys
mode=sys.argv[1]
ev=threading.Event(); lk=threading.Lock(); lk.acquire()
def run():
    tid=threading.get_native_id()
    t0=int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0]); n=0
    end=time.monotonic()+20
    while time.monotonic()<end:
        if mode=="event": ev.wait(0.05)
        elif mode=="lock": lk.acquire(timeout=0.05)
        else: time.sleep(0.05)
        n+=1
    t1=int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
    print(mode, n, "%.1f us/wake" % ((t1-t0)/n/1e3))
t=threading.Thread(target=run); t.start(); t.join()
