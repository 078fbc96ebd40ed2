"""What slows a workflow's own thread while ``OverlappedIO`` writes a DLWP ensemble
to disk: waiting for the GIL, or for the device.

In the seventeenth and eighteenth sessions (H100, DLWP 16 x 20, batch 8, all 7
variables to a Zarr store on disk, compile=True), after the first step the
workflow's thread was busy almost the whole call: 23 ms a step in the model's
iterator (its compiled step alone: 5.3 ms) and 21 ms a call in ``io.write``, while
the writers were rarely waited for. Two readings fit: the thread waits for the GIL
(every PyTorch op lets it go and takes it back, and 8 lanes, 8 put threads and the
directory thread run Python beside it), or for the device (the step's copies are
queued on the caller's stream, and anything that synchronises waits for them).

This script runs the same shape of work without a model: a step is a few dozen
PyTorch ops on a 232 MB device tensor laid out as DLWP's output (its 56 fields
interleaved), a hundred small ones, then ``io.write(*split_coords(...))`` of its 7
variables for 8 members, 2 batches x 21 writes (as the ensemble's). Per row: the
whole loop (flushed), and on the loop's thread, per step, the wall and CPU seconds
(``time.thread_time``) of the model part and of the write. CPU well under wall is
waiting for the GIL (CUDA spins the host thread while it waits for a stream, which
counts as CPU).

Rows, a fresh store each, JSON after every row:

- ``alone``: the steps, no IO (what the thread does with nothing beside it);
- ``ov-disk``: ``OverlappedIO(ZarrBackend(disk))`` as compile=True wraps it;
- ``ov-disk-si``: the same with ``sys.setswitchinterval(0.0005)`` (restored);
- ``ov-disk-w4``: 4 lanes and 4 put threads instead of 8 each;
- ``ov-disk-pervar``: each variable made contiguous on the device before the
  write, so that ``OverlappedIO`` copies them one by one: a gather and a copy per
  variable, as before 6ccbb89 (which gathers the step's 7 in one ``torch.stack``
  and one copy, fewer PyTorch calls on the loop's thread);
- ``ov-memory``: ``OverlappedIO(ZarrBackend())``, in memory;
- ``threads-disk``: the same bytes written by 8 threads from host copies with
  plain ``open``/``write`` into premade directories (little Python per chunk):
  what pure I/O threads beside it cost the loop's thread;
- ``procs-disk``: the same files (their directories made as they go, as Zarr's
  file step does) written by 8 worker processes from a ring of 3 step buffers in a
  file mapped in memory, pinned for the device's copy; a dispatch thread hands a
  step to the workers once its copy is done: what the loop's thread would win
  from writers outside the process, which take none of its GIL.

Run from the repository root: ``python3 docs/bench/2026-11-28-h100-eighteenth/
contention.py OUT`` (``ROWS=a,b``; ``H``, ``W`` small on a CPU).
"""

import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

B, V, STEPS, BATCHES = 8, 7, 21, 2
H, W = int(os.environ.get("H", 721)), int(os.environ.get("W", 1440))
BASE = Path(os.environ.get("BASE", "/tmp/contention"))
SMALL_OPS = int(os.environ.get("SMALL_OPS", 100))
BIG_OPS = int(os.environ.get("BIG_OPS", 30))


# Worker processes: the ring of step buffers, mapped from a file.
_ring: dict = {}


def _init(path, shape):
    _ring["host"] = np.memmap(path, dtype="float32", mode="r", shape=shape)


def _job(slot, d, batch, lead, pairs):
    host = _ring["host"]
    for m, v in pairs:
        folder = Path(d) / f"v{v}" / str(batch * B + m) / str(lead)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "0", "wb") as f:
            f.write(memoryview(host[slot, m, v]).cast("B"))
    return len(pairs)


def main():
    import torch
    import zarr
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    from earth2studio_compile.io import OverlappedIO

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    names = [f"v{i}" for i in range(V)]
    lat = np.linspace(90, -90, H)
    lon = np.linspace(0, 360, W, endpoint=False)
    t0 = np.array([np.datetime64("2024-01-01")])
    leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS)])
    res: dict = {
        "python": sys.version.split()[0],
        "switchinterval": sys.getswitchinterval(),
        "gb": BATCHES * STEPS * B * V * H * W * 4 / 1e9,
        "rows": {},
    }
    wanted = os.environ.get("ROWS")
    # DLWP's output: (fields, values) transposed, 56 = 8 members x 7 variables.
    state = torch.randn(H * W, B * V, device=device)
    small = torch.randn(64, device=device)

    def step(k):
        y = state * (1.0 + 1e-6 * k)
        for _ in range(BIG_OPS):
            y.mul_(1.0)
        s = small
        for _ in range(SMALL_OPS):
            s = s + 1.0
        return y.T.view(B, 1, 1, V, H, W)

    def coords_of(batch, lead):
        return OrderedDict(
            ensemble=np.arange(batch * B, (batch + 1) * B),
            time=t0,
            lead_time=leads[lead : lead + 1],
            variable=np.array(names),
            lat=lat,
            lon=lon,
        )

    def loop(write, flush):
        model, model_cpu, writes, writes_cpu = [], [], [], []
        cuda and torch.cuda.synchronize()
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        for batch in range(BATCHES):
            for lead in range(STEPS):
                c, t = time.thread_time(), time.perf_counter()
                x = step(lead)
                model.append(time.perf_counter() - t)
                model_cpu.append(time.thread_time() - c)
                c, t = time.thread_time(), time.perf_counter()
                write(x, batch, lead)
                writes.append(time.perf_counter() - t)
                writes_cpu.append(time.thread_time() - c)
        flush()
        cuda and torch.cuda.synchronize()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        ms = lambda xs: round(1e3 * statistics.median(xs), 2)  # noqa: E731
        return {
            "s": wall,
            "model_ms": ms(model),
            "model_cpu_ms": ms(model_cpu),
            "write_ms": ms(writes),
            "write_cpu_ms": ms(writes_cpu),
            "model_s": sum(model),
            "model_cpu_s": sum(model_cpu),
            "write_s": sum(writes),
            "write_cpu_s": sum(writes_cpu),
            # The process's context switches over the loop: each a thread that
            # let go of the CPU (voluntary: mostly waits for the GIL or a lock).
            "ctx_voluntary": after.ru_nvcsw - before.ru_nvcsw,
            "ctx_involuntary": after.ru_nivcsw - before.ru_nivcsw,
        }

    def row(name, fn):
        if wanted and name not in wanted.split(","):
            return
        shutil.rmtree(BASE, ignore_errors=True)
        os.sync()
        BASE.mkdir(parents=True)
        r = fn()
        res["rows"][name] = r
        (out / "contention.json").write_text(json.dumps(res, indent=1))
        print(name, json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)

    total = OrderedDict(
        ensemble=np.arange(BATCHES * B),
        time=t0,
        lead_time=leads,
        lat=lat,
        lon=lon,
    )

    def write(io, x, coords, pervar):
        xs, c, names = split_coords(x, coords, "variable")
        io.write([v.contiguous() for v in xs] if pervar else xs, c, names)

    def overlapped(disk=True, workers=None, interval=None, pervar=False):
        def run():
            files = {"threading.max_workers": workers} if workers else {}
            backend = ZarrBackend(
                str(BASE / "s.zarr") if disk else None,
                backend_kwargs={"overwrite": True},
            )
            saved = sys.getswitchinterval()
            with zarr.config.set(files):
                io = OverlappedIO(backend, workers=workers)
                io.add_array(total, names)
                try:
                    if interval:
                        sys.setswitchinterval(interval)
                    return loop(
                        lambda x, b, k: write(io, x, coords_of(b, k), pervar),
                        io.close,
                    )
                finally:
                    sys.setswitchinterval(saved)

        return run

    def by_threads():
        for batch in range(BATCHES):
            for lead in range(STEPS):
                for m in range(B):
                    for v in range(V):
                        (BASE / names[v] / str(batch * B + m) / str(lead)).mkdir(
                            parents=True
                        )
        os.sync()
        pool = ThreadPoolExecutor(8)
        hosts = [torch.empty((B, V, H, W), pin_memory=cuda) for _ in range(3)]
        pending: list = []

        def put(path, view):
            with open(path, "wb") as f:
                f.write(memoryview(view).cast("B"))

        def write(x, batch, lead):
            if len(pending) == len(hosts):  # the step that used this buffer
                for f in pending.pop(0):
                    f.result()
            host = hosts[(batch * STEPS + lead) % len(hosts)]
            host.copy_(x[:, 0, 0])  # a device gather, then the copy: synchronous
            h = host.numpy()
            pending.append(
                [
                    pool.submit(
                        put,
                        BASE / names[v] / str(batch * B + m) / str(lead) / "0",
                        h[m, v],
                    )
                    for m in range(B)
                    for v in range(V)
                ]
            )

        def flush():
            for fs in pending:
                for f in fs:
                    f.result()
            pool.shutdown()

        return loop(write, flush)

    row("alone", lambda: loop(lambda x, b, k: None, lambda: None))
    row("ov-disk", overlapped())
    row("ov-disk-si", overlapped(interval=0.0005))
    row("ov-disk-w4", overlapped(workers=4))
    row("ov-disk-pervar", overlapped(pervar=True))
    row("ov-memory", overlapped(disk=False))
    row("threads-disk", by_threads)

    def by_processes():
        # In shared memory (/dev/shm): Linux refuses a long-term pin of pages of an
        # ordinary file's mapping, and the refused cudaHostRegister left an error
        # that the next kernel launch raised (the nineteenth session's run at
        # da38751). Registered on a thread of its own, as io/pinned.py does, so
        # that a failure's error stays there; unpinned, the copies are synchronous.
        shm = Path(os.environ.get("RING_DIR", "/dev/shm"))
        ring = (shm if shm.is_dir() else BASE.parent) / "contention-ring.bin"
        shape = (3, B, V, H, W)
        mapped = np.memmap(ring, dtype="float32", mode="w+", shape=shape)
        shared = torch.from_numpy(mapped)
        res["ring_pinned"] = False
        if cuda:  # cudaHostRegisterDefault: pinned for asynchronous copies
            with ThreadPoolExecutor(1) as one:
                rc = one.submit(
                    torch.cuda.cudart().cudaHostRegister,
                    shared.data_ptr(),
                    shared.numel() * 4,
                    0,
                ).result()
            res["ring_pinned"] = int(rc) == 0
            res["ring_register"] = str(rc)
        split = [[(m, v) for v in range(V) for m in range(B)][i::8] for i in range(8)]
        spawn = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            8, mp_context=spawn, initializer=_init, initargs=(str(ring), shape)
        )
        list(pool.map(time.sleep, [0.5] * 8))  # started before the clock
        dispatch = ThreadPoolExecutor(1)
        pending: list = []

        def hand_over(ready, slot, batch, lead):
            ready is not None and ready.synchronize()
            return [pool.submit(_job, slot, str(BASE), batch, lead, p) for p in split]

        def write(x, batch, lead):
            if len(pending) == 3:  # the step that used this slot
                for f in pending.pop(0).result():
                    f.result()
            slot = (batch * STEPS + lead) % 3
            shared[slot].copy_(x[:, 0, 0], non_blocking=cuda)
            ready = torch.cuda.Event() if cuda else None
            ready is not None and ready.record()
            pending.append(dispatch.submit(hand_over, ready, slot, batch, lead))

        def flush():
            for handed in pending:
                for f in handed.result():
                    f.result()
            dispatch.shutdown()
            pool.shutdown()

        try:
            return loop(write, flush)
        finally:
            if cuda and res["ring_pinned"]:
                torch.cuda.cudart().cudaHostUnregister(shared.data_ptr())
            ring.unlink(missing_ok=True)

    row("procs-disk", by_processes)
    row("ov-disk-again", overlapped())
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
