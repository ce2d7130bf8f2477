"""The worker's own cost per message: W handlers that sleep 1 ms draining a full queue.

    python -m benchmarks.worker_profile --dsn postgresql://postgres@127.0.0.1/test -w 16
    python -m benchmarks.worker_profile -w 16 --seconds 20 &   # prints "measuring pid P"
    py-spy record --gil --format raw -d 10 -o worker.txt --pid P
    python -m benchmarks.worker_profile --summarize worker.txt

With 1 ms handlers, W handler threads could complete W x 1,000 msg/s if the
runtime cost nothing; the table says how close one worker process comes, and
how much CPU it spent per message. Run it under py-spy (or pyinstrument) to
see where that CPU goes; `--summarize FILE` folds a py-spy raw profile into
the functions that hold the GIL longest.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import sys
import threading
import time

from benchmarks.common import DEFAULT_DSN, scratch_database
from pgqueue import App, Client, Message, Worker, WorkerSettings
from pgqueue._log import configure_logging


def run_once(dsn: str, w: int, seconds: float, **settings: int) -> tuple[float, float]:
    """Completions per second and CPU microseconds per message for one worker in this process."""
    messages = int(min(w * 1000, 40_000) * (seconds + 2) * 1.2) + 2000
    handled = 0
    lock = threading.Lock()
    app = App()

    @app.handler("profile")
    def work(msg: Message) -> None:
        nonlocal handled
        time.sleep(0.001)
        with lock:
            handled += 1

    with Client.from_dsn(dsn) as client:
        client.create_queue("profile")
        client.purge_queue("profile")
        for start in range(0, messages, 1000):
            batch = [{"n": i, "pad": "x" * 240} for i in range(start, min(start + 1000, messages))]
            client.send_batch("profile", batch)
    worker_settings = WorkerSettings(queues=("profile",), concurrency=w, **settings)
    wclient = Client.from_dsn(dsn, max_size=worker_settings.pool_size)
    worker = Worker(app, wclient, worker_settings)
    t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    t.start()
    time.sleep(2)  # warm up
    print(f"measuring pid {os.getpid()} for {seconds:g}s", file=sys.stderr, flush=True)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    n0, t0 = handled, time.monotonic()
    time.sleep(seconds)
    n1, t1 = handled, time.monotonic()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    worker.stop()
    t.join()
    wclient.close()
    if n1 >= messages:
        sys.exit(f"the queue ran dry at W={w}: the rate is understated; fill more")
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    done = max(1, n1 - n0)
    return done / (t1 - t0), cpu / done * 1e6


def summarize(path: str, top: int) -> None:
    """Print the functions a py-spy raw profile spent most samples in (self and total)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            samples += n
            frames = [
                fr.split(" (")[0] + " " + fr.split("(")[-1].split(":")[0].rsplit("/", 1)[-1]
                for fr in stack.split(";")
            ]
            own[frames[-1]] += n
            for fr in set(frames):
                total[fr] += n
    print(f"{samples} samples")
    print("| self % | total % | function |\n|---|---|---|")
    for fr, n in own.most_common(top):
        print(f"| {100 * n / samples:.1f} | {100 * total[fr] / samples:.1f} | {fr} |")


def main() -> None:
    """Print completions/s and CPU per message, or fold a profile."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("-w", "--concurrency", type=int, action="append")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--batch", type=int, help="WorkerSettings.batch (default: its default)")
    ap.add_argument("--readers", type=int, help="WorkerSettings.readers (default: its default)")
    ap.add_argument("--summarize", metavar="RAW_PROFILE")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    configure_logging(json=True, level="ERROR")
    if args.summarize:
        summarize(args.summarize, args.top)
        return
    print("| W | completions/s | of W x 1,000 | worker CPU us/msg |\n|---|---|---|---|")
    for w in args.concurrency or [16]:
        rates, cpus = [], []
        for _ in range(args.runs):
            with scratch_database(args.dsn, "profile") as dsn:
                settings = {
                    k: v for k in ("batch", "readers") if (v := getattr(args, k)) is not None
                }
                rate, cpu = run_once(dsn, w, args.seconds, **settings)
            rates.append(rate)
            cpus.append(cpu)
        rate = statistics.median(rates)
        print(
            f"| {w} | {rate:,.0f} | {100 * rate / (w * 1000):.0f}% |"
            f" {statistics.median(cpus):,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
