"""What the bounded host wait costs: ``tilefuse.synchronize()`` against ``torch.cuda.synchronize()``.

    python -m benchmarks.sync_cost [--world 2] [--waits-ms 0,0.05,0.5,5] [--reps 60] [--csv sync_cost.csv]
                                   [--forms tilefuse.synchronize,event_query_spin,event_query_yield]

At world 2 and more, tilefuse's host wait for the device polls an event and the peers' processes
(so that it can give up once a peer has exited) where torch's blocks in the driver. Rank 0 queues a
kernel that keeps the GPU busy for each ``--waits-ms`` value and waits for it, with torch's and with
tilefuse's wait in turn (``--reps`` pairs, interleaved); the other ranks idle in a host barrier
meanwhile. Reports the median host time of each wait and the median of their paired differences
(what the polling adds). GPU only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import tilefuse

from .launch import launch
from .results import row, run_info, write_csv


def _timed_wait(wait, queue) -> float:
    queue()
    t0 = time.perf_counter()
    wait()
    return (time.perf_counter() - t0) * 1e3


def _event_poll(yield_cpu: bool):
    """A wait made of event queries alone (no peer checks, no error record): what the polling costs."""
    event = torch.cuda.Event()

    def wait():
        event.record()
        while not event.query():
            if yield_cpu:
                os.sched_yield()
        torch.cuda.synchronize()

    return wait


FORMS = {"tilefuse.synchronize": lambda: tilefuse.synchronize, "event_query_spin": lambda: _event_poll(False),
         "event_query_yield": lambda: _event_poll(True)}


def _job(ctx, waits_ms: list, reps: int, forms: list) -> list:
    from tilefuse.tuning.autotune import _sleep_cycles_per_ms

    rows = []
    tilefuse.device_barrier()  # one collective call: the waits record behind its stream
    tilefuse.synchronize()
    if ctx.rank == 0:
        rate = _sleep_cycles_per_ms(ctx.device)
        waits = {name: FORMS[name]() for name in forms}
        for ms in waits_ms:
            cycles = int(rate * ms)
            queue = (lambda c=cycles: torch.cuda._sleep(c)) if cycles else (lambda: None)
            for name, wait in waits.items():
                pairs = []
                for _ in range(reps):
                    t_torch = _timed_wait(torch.cuda.synchronize, queue)
                    t_form = _timed_wait(wait, queue)
                    pairs.append((t_torch, t_form))
                t_torch = statistics.median(p[0] for p in pairs)
                t_form = statistics.median(p[1] for p in pairs)
                extra = statistics.median(p[1] - p[0] for p in pairs)
                rows.append((ms, name, t_torch, t_form, extra))
    dist.barrier(group=ctx.host_group)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--waits-ms", default="0,0.05,0.5,5")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--forms", default="tilefuse.synchronize",
                   help=f"comma-separated waits timed against torch.cuda.synchronize, of {sorted(FORMS)} (the "
                        "event_query forms: the polling alone, spinning or yielding the CPU between queries)")
    p.add_argument("--csv", default="sync_cost.csv")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("sync_cost: needs a GPU", flush=True)
        return 1
    waits = [float(x) for x in args.waits_ms.split(",")]
    forms = args.forms.split(",")
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        p.error(f"unknown form(s) {unknown}; forms are {sorted(FORMS)}")
    results = launch(_job, args.world, waits, args.reps, forms)
    out = []
    for ms, name, t_torch, t_form, extra in results[0]:
        print(f"busy {ms:6.2f} ms: torch.cuda.synchronize {t_torch:8.3f} ms, {name} {t_form:8.3f} ms, "
              f"paired difference {extra * 1e3:+8.1f} us", flush=True)
        note = f"GPU busy {ms} ms before the wait; median of {args.reps} interleaved pairs"
        for variant, value in (("torch.cuda.synchronize", t_torch), (name, t_form)):
            out.append(row("synchronize", variant, None, None, None, None, args.world, "wait_ms", value, note))
        out.append(row("synchronize", name, None, None, None, None, args.world, "extra_us",
                       extra * 1e3, note + f"; {name} minus torch, paired"))
    write_csv(out, args.csv, run_info(torch.device("cuda", 0)))
    print(f"wrote {len(out)} rows to {args.csv}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
