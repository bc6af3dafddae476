"""The long fuzz run (opt-in): a mutation fuzzer over every door's target
(``vgpumon.testing.fuzz``), started from the recorded inputs, on worker processes.

Each input runs in a worker with a per-input timeout: an input that passes or gets its target's
documented refusal is counted as such; any other exception is a crash, one that outlives the
timeout a hang (the worker is replaced). Findings (target, kind, the input as hex, the error)
go to the ``--json`` file, with the counts; the last line printed is the one-line JSON summary.

    python bench/fuzz_long.py --inputs 20000 --workers 2 --json /tmp/fuzz-local.json
    python bench/fuzz_long.py --inputs 1000000 --workers 16 --json bench/results/fuzz-1m.json

Inputs are split evenly over the targets (``--targets`` picks some); ``--seed`` makes a run
repeatable: every batch's inputs are a function of the seed, the target and the batch's number,
made in the worker that runs them. ``--shard K/N`` runs one of N parts of a run (on machines whose
time is cut into calls), ``--merge`` adds the parts' files up into the run's. Results:
docs/reliability.md, "Fuzzing".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpumon.testing.fuzz import TARGETS, seeds  # noqa: E402

#: Tokens a mutation may insert: what broke a door once, or could.
_TOKENS = [
    b"NaN", b"+Inf", b"-Inf", b"inf", b"1" * 400, b"1e400", b"-0", b"0x1p3", b"\x00", b"\xff\xfe", b"\xed\xa0\x80",
    b'"', b"\\", b"\n", b"\r\n", b"{", b"}", b"[", b"]", b"null", b"true", b"[]", b"{}", b'"\\u0000"', b'"\\ud800"',
    b"# TYPE", b"# HELP", b'{engine="', b'model_name="', b'le="', b"_bucket", b"_total", b"_created", b"=", b",",
    b"9" * 40, b"-1", b"1e300", b"Bearer ", b"%00", b"%ff", b"?window=", b"&since=", b"--json", b"--window", b"\x00--since",
    b"x" * 300, b" " * 64,
]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    """One to eight mutations of ``data``: byte flips, deletions, duplications, inserted tokens,
    random bytes, a splice with another seed."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        at = rng.randint(0, len(buf))
        if op == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            del buf[at:at + rng.randint(1, 64)]
        elif op == 2 and buf:
            start = rng.randrange(len(buf))
            buf[at:at] = buf[start:start + rng.randint(1, 256)]
        elif op in (3, 4):
            buf[at:at] = rng.choice(_TOKENS)
        elif op == 5:
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            other = rng.choice(corpus)
            cut = rng.randint(0, len(other))
            buf[at:] = other[cut:]
    return bytes(buf[: 4 << 20])


# -- the worker -------------------------------------------------------------------------------------


def _alarm(_sig: int, _frame: object) -> None:
    raise TimeoutError("input timed out")


def _batch_inputs(seed: int, name: str, batch_no: int, n: int, corpus: list[bytes]) -> list[bytes]:
    """The inputs of one batch: a function of the run's seed, the target and the batch number only,
    so any worker (or any shard of the run, on another machine) makes the same ones."""
    rng = random.Random(f"{seed}:{name}:{batch_no}")
    return [mutate(rng, rng.choice(corpus), corpus) for _ in range(n)]


def _worker(jobs: mp.Queue, results: mp.Queue, timeout: float, seed: int) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    corpora: dict[str, list[bytes]] = {}
    for target in TARGETS.values():  # imports and first-use state, before any input is timed
        corpora[target.name] = seeds(target.name)
        for first in corpora[target.name][:1]:
            try:
                target.run(first)
            except Exception:  # noqa: BLE001, S110 - warming up: a seed's outcome is judged by the run, not here
                pass
    while True:
        job = jobs.get()
        if job is None:
            return
        name, batch_no, n = job
        target = TARGETS[name]
        out = []
        for data in _batch_inputs(seed, name, batch_no, n, corpora[name]):
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                target.run(data)
                kind, error = "passed", None
            except target.refusals:
                kind, error = "refused", None
            except TimeoutError:
                kind, error = "hang", f"no answer within {timeout:g} s"
            except Exception as exc:  # noqa: BLE001 - any other exception is what we look for
                kind, error = "crash", "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            out.append((kind, data.hex() if kind in ("crash", "hang") else "", error))
        results.put((name, out))


_KINDS = ("inputs", "passed", "refused", "crash", "hang")


def run(inputs: int, workers: int, timeout: float, seed: int, names: list[str], batch: int = 50,
        shard: tuple[int, int] = (0, 1)) -> dict:
    """Fuzz ``inputs`` inputs over ``names`` on ``workers`` processes; the counts and findings.
    ``shard`` (k, n) runs only the batches whose number is k modulo n: the n shards of one seed,
    run anywhere, are together exactly the whole run (``--merge`` adds them up)."""
    k, of = shard
    ctx = mp.get_context("fork")
    jobs: mp.Queue = ctx.Queue()
    results: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(jobs, results, timeout, seed), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    per = {n: inputs // len(names) + (1 if i < inputs % len(names) else 0) for i, n in enumerate(names)}
    pending = 0
    batch_no = 0
    for name, count in per.items():
        while count > 0:
            n = min(batch, count)
            if batch_no % of == k:
                jobs.put((name, batch_no, n))
                pending += 1
            count -= n
            batch_no += 1
    for _ in procs:
        jobs.put(None)
    counts = {n: dict.fromkeys(_KINDS, 0) for n in names}
    findings: list[dict] = []
    t0 = time.monotonic()
    lost = 0
    while pending:
        try:
            name, out = results.get(timeout=30)
        except queue.Empty:
            if any(p.is_alive() for p in procs):
                continue
            lost = pending  # every worker is gone (killed by a crash of the interpreter itself)
            break
        pending -= 1
        for kind, hexdata, error in out:
            counts[name]["inputs"] += 1
            counts[name][kind] += 1
            if kind in ("crash", "hang") and len(findings) < 200:
                findings.append({"target": name, "kind": kind, "error": error, "input_hex": hexdata[:20000]})
    for p in procs:
        p.join(30)
    total = {key: sum(c[key] for c in counts.values()) for key in _KINDS}
    return {"seed": seed, "workers": workers, "timeout_s": timeout, "seconds": round(time.monotonic() - t0, 1),
            "shard": f"{k}/{of}", "planned_inputs": inputs, **total, "batches_lost": lost, "targets": counts,
            "findings": findings}


def merge(parts: list[dict]) -> dict:
    """The shards of one run added up; refused unless they are the n distinct shards of one seed,
    one input count and one target list."""
    keys = {(p["seed"], p["planned_inputs"], tuple(p["targets"])) for p in parts}
    shards = sorted((p["shard"] for p in parts), key=lambda s: int(s.split("/")[0]))  # 2/20 before 10/20
    of = {int(s.split("/")[1]) for s in shards}
    if len(keys) != 1 or len(of) != 1 or shards != [f"{i}/{len(parts)}" for i in range(len(parts))]:
        raise SystemExit(f"--merge: not the shards of one run: {shards}, seeds/inputs/targets {sorted(keys)}")
    names = list(parts[0]["targets"])
    counts = {n: {key: sum(p["targets"][n][key] for p in parts) for key in _KINDS} for n in names}
    total = {key: sum(c[key] for c in counts.values()) for key in _KINDS}
    return {"seed": parts[0]["seed"], "workers": [p["workers"] for p in parts], "timeout_s": parts[0]["timeout_s"],
            "seconds": round(sum(p["seconds"] for p in parts), 1), "shard_seconds": [p["seconds"] for p in parts],
            "shard": f"{len(parts)} of {len(parts)}", "planned_inputs": parts[0]["planned_inputs"], **total,
            "batches_lost": sum(p["batches_lost"] for p in parts), "targets": counts,
            "findings": [f for p in parts for f in p["findings"]][:200]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=20_000, help="inputs in all, split over the targets")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds one input may take before it is a hang")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: " + ", ".join(TARGETS))
    ap.add_argument("--shard", default="0/1", help="K/N: run the K-th of N equal parts of the run (default 0/1: all)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON", help="add up the shards' --json files instead")
    ap.add_argument("--json", type=Path, help="write the counts and findings here")
    args = ap.parse_args()
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    try:
        k, of = (int(x) for x in args.shard.split("/"))
    except ValueError:
        k, of = -1, 0
    if unknown or args.inputs < 1 or args.workers < 1 or not 0 <= k < of:
        ap.error(f"unknown targets {unknown}" if unknown else
                 "--shard is K/N with 0 <= K < N" if not 0 <= k < of else "--inputs and --workers must be at least 1")
    if args.merge:
        result = merge([json.loads(p.read_text()) for p in args.merge])
    else:
        result = run(args.inputs, args.workers, args.timeout, args.seed, names, shard=(k, of))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    summary = {key: result[key] for key in (*_KINDS, "seconds", "workers", "seed", "shard")}
    summary["by_target"] = {n: {key: c[key] for key in ("inputs", "crash", "hang")} for n, c in result["targets"].items()}
    summary["batches_lost"] = result["batches_lost"]
    print(json.dumps(summary, separators=(",", ":")))
    sys.exit(1 if result["crash"] or result["hang"] or result["batches_lost"] else 0)


if __name__ == "__main__":
    main()
