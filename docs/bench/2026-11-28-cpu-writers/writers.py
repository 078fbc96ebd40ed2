"""Where ``OverlappedIO``'s disk path spends its time, on a CPU: the same bytes
written by it, by plain threads, and by Zarr's own async API.

Issue 34: on an H200 host ``OverlappedIO(ZarrBackend(disk))`` moved DLWP-shaped
steps at about half the rate of 8 plain threads writing the same files
(docs/bench/2026-11-28-h200-twentieth). This runs the write side alone, with CPU
tensors (no copies to wait for): an ensemble's steps of ``V`` variables x ``B``
members of ``H`` x ``W`` float32 (one Zarr chunk per member, variable and lead
time, as Earth2Studio's ``ZarrBackend`` chunks them), ``STEPS`` steps, each
``io.write(*split_coords(x, coords, "variable"))`` as the ensemble workflow calls
it, into a fresh store in ``BASE`` (on disk).

Rows (``ROWS=a,b`` picks some; a fresh directory each):

- ``ov``: ``for_compiled_call(ZarrBackend(path))``, what ``compile=True`` wraps the
  backend in (its lanes: ``min(8, cores)``);
- ``ov-w8``: ``OverlappedIO(ZarrBackend(path), workers=8)``: the lanes of a
  16-core GPU host;
- ``threads``: 8 threads write each chunk's bytes with ``open``/``write`` into
  directories made beforehand (outside the clock), as contention.py's
  ``threads-disk``;
- ``ov-settled``: ``ov`` once its chunk directories are made (as a first step lets
  them be), before the clock;
- ``threads-atomic``: ``threads`` through Zarr's ``_atomic_write`` (a temporary
  file renamed into place);
- ``threads-mkdir``: the same, each thread making its chunk's directories
  (``os.makedirs``) as it goes, as a store's first writes must;
- ``zarr-async``: Zarr's own async API, one event loop, the step's ``V``
  ``AsyncArray.setitem`` gathered, under ``zarr.config`` ``async.concurrency`` =
  ``threading.max_workers`` = 8;
- ``upstream``: ``ZarrBackend.write`` itself, synchronous.

Per row: the whole loop's seconds (flushed), per step; the seconds the loop's own
thread spent in ``write`` (wall and CPU); and each thread's CPU seconds, read from
``/proc`` by a sampler every ``TICK`` seconds (threads grouped by name, digits
dropped). With ``SAMPLE=1`` the sampler also records every thread's innermost
Python frames (``sys._current_frames``) and prints the most frequent, per group:
an in-process stand-in for py-spy, which this machine lacks. Each row's files
(but Zarr's metadata) are checked equal to the first row's.

Run from the repository root, the package taken from it (JSON to
``OUT/writers.json``)::

    PYTHONPATH=. python docs/bench/2026-11-28-cpu-writers/writers.py OUT
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

B, V, STEPS = 4, 26, 10
H, W = int(os.environ.get("H", 300)), int(os.environ.get("W", 600))
BASE = Path(os.environ.get("BASE", "/tmp/cpu-writers"))
TICK = float(os.environ.get("TICK", 0.01))
SAMPLE = os.environ.get("SAMPLE", "") == "1"
THREADS = 8


class Sampler:
    """Per-thread CPU seconds (from /proc) and, with ``SAMPLE``, innermost frames."""

    def __init__(self) -> None:
        self.cpu: dict[int, tuple[str, float]] = {}
        self.start: dict[int, float] = {}  # CPU seconds before the row, per thread
        self.frames: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._hz = os.sysconf("SC_CLK_TCK")

    def _read(self) -> None:
        me = self._thread.ident  # the sampler: not counted (None before it starts)
        names = {t.ident: t.name for t in threading.enumerate()}
        for t in threading.enumerate():
            if t.native_id is None or t.ident == me:
                continue
            try:
                stat = Path(f"/proc/self/task/{t.native_id}/stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            user, system = int(fields[11]) / self._hz, int(fields[12]) / self._hz
            self.cpu[t.native_id] = (_group(t.name), user, system)
        if SAMPLE:
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                group = _group(names.get(ident, "?"))
                self.frames[group][_where(frame)] += 1

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            self._read()

    def __enter__(self) -> Sampler:
        self._read()
        self.start = {k: (u, s) for k, (_, u, s) in self.cpu.items()}
        self.frames.clear()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._read()
        self._stop.set()
        self._thread.join()

    def by_group(self) -> dict[str, list[float]]:
        """CPU seconds in the row per group of threads: ``[user, system]``."""
        out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for tid, (group, user, system) in self.cpu.items():
            u0, s0 = self.start.get(tid, (0.0, 0.0))
            out[group][0] += user - u0
            out[group][1] += system - s0
        return {
            k: [round(u, 2), round(s, 2)]
            for k, (u, s) in sorted(out.items())
            if u + s > 0.005
        }


def _group(name: str) -> str:
    name = re.sub(r"#\d+", "", name)
    return re.sub(r"[ _-]?\d+(_\d+)?$", "", name)


def _where(frame) -> str:
    """The innermost frames, shortened: ``file:function`` of up to 3."""
    parts = []
    while frame is not None and len(parts) < 3:
        code = frame.f_code
        parts.append(f"{Path(code.co_filename).name}:{code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


def main() -> None:
    import torch
    import zarr
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    import earth2studio_compile
    from earth2studio_compile.io import OverlappedIO, for_compiled_call

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    names = [f"v{i}" for i in range(V)]
    lat = np.linspace(90, -90, H)
    lon = np.linspace(0, 360, W, endpoint=False)
    t0 = np.array([np.datetime64("2024-01-01")])
    leads = np.array([np.timedelta64(6 * i, "h") for i in range(STEPS)])
    total = OrderedDict(
        ensemble=np.arange(B), time=t0, lead_time=leads, lat=lat, lon=lon
    )
    # Distinct steps, none all zero (Zarr's fill value): every chunk is stored.
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(B, 1, 1, V, H, W, generator=gen) + 1.0
    xs = [base + k for k in range(STEPS)]

    def coords_of(lead: int) -> OrderedDict:
        return OrderedDict(
            ensemble=np.arange(B),
            time=t0,
            lead_time=leads[lead : lead + 1],
            variable=np.array(names),
            lat=lat,
            lon=lon,
        )

    res: dict = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "zarr": zarr.__version__,
        "numpy": np.__version__,
        "cores": os.cpu_count(),
        "package": earth2studio_compile.__file__,
        "shape": [B, V, H, W],
        "steps": STEPS,
        "step_mb": B * V * H * W * 4 / 1e6,
        "rows": {},
    }
    wanted = os.environ.get("ROWS")
    first_files: dict[str, str] = {}

    def files_of(root: Path) -> dict[str, str]:
        return {
            str(f.relative_to(root)): hashlib.md5(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*"))
            if f.is_file()
            and not f.name.startswith("zarr.json")
            and not f.name.startswith(".z")
            and f.parts[len(root.parts)] in names
        }

    def loop(write, flush) -> dict:
        writes, writes_cpu = [], []
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        with Sampler() as sampler:
            start = time.perf_counter()
            for lead in range(STEPS):
                c, t = time.thread_time(), time.perf_counter()
                write(xs[lead], lead)
                writes.append(time.perf_counter() - t)
                writes_cpu.append(time.thread_time() - c)
            c, t = time.thread_time(), time.perf_counter()
            flush()
            flush_s = time.perf_counter() - t
            flush_cpu = time.thread_time() - c
            wall = time.perf_counter() - start
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        row = {
            "s": round(wall, 3),
            "step_s": round(wall / STEPS, 4),
            "gb_per_s": round(res["step_mb"] * STEPS / 1e3 / wall, 2),
            "write_ms_median": round(1e3 * statistics.median(writes), 2),
            "write_s": round(sum(writes), 3),
            "write_cpu_s": round(sum(writes_cpu), 3),
            "flush_s": round(flush_s, 3),
            "flush_cpu_s": round(flush_cpu, 3),
            "cpu_user_s": round(r1.ru_utime - r0.ru_utime, 3),
            "cpu_sys_s": round(r1.ru_stime - r0.ru_stime, 3),
            "switches": (r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw),
            "thread_cpu_s": sampler.by_group(),
        }
        if SAMPLE:
            row["frames"] = {
                g: c.most_common(12) for g, c in sorted(sampler.frames.items())
            }
        return row

    def row(name: str, fn, root: str) -> None:
        if wanted and name.partition("#")[0] not in wanted.split(","):
            return
        shutil.rmtree(BASE, ignore_errors=True)
        os.sync()
        BASE.mkdir(parents=True)
        r = fn()
        files = files_of(BASE / root)
        if not first_files:
            first_files.update(files)
        r["files"] = len(files)
        r["same_files"] = files == first_files
        res["rows"][name] = r
        (out / "writers.json").write_text(json.dumps(res, indent=1))
        shown = {k: v for k, v in r.items() if k != "frames"}
        print(name, json.dumps(shown), flush=True)
        for group, top in r.get("frames", {}).items():
            print(f"  [{group}] {sum(n for _, n in top)} in top", flush=True)
            for where, n in top:
                print(f"    {n:6d} {where}", flush=True)

    def overlapped(workers: int | None, settled: bool = False):
        def run() -> dict:
            backend = ZarrBackend(
                str(BASE / "s.zarr"), backend_kwargs={"overwrite": True}
            )
            io = (
                for_compiled_call(backend)
                if workers is None
                else OverlappedIO(backend, workers=workers)
            )
            assert io is not None
            io.add_array(total, names)
            if settled and io._ahead is not None:
                io._ahead._done.result()  # as a model's first step would let it
                os.sync()
            r = loop(
                lambda x, k: io.write(*split_coords(x, coords_of(k), "variable")),
                io.flush,
            )
            r["workers"] = io.workers
            r["blocked_s"] = round(io.blocked_s, 3)
            return r

        return run

    def upstream() -> dict:
        backend = ZarrBackend(str(BASE / "s.zarr"), backend_kwargs={"overwrite": True})
        backend.add_array(total, names)
        return loop(
            lambda x, k: backend.write(*split_coords(x, coords_of(k), "variable")),
            lambda: None,
        )

    def chunk_path(v: int, m: int, lead: int) -> Path:
        # Zarr 3's default key: c/<ensemble>/<time>/<lead_time>/<lat>/<lon>
        return BASE / "s.zarr" / names[v] / "c" / str(m) / "0" / str(lead) / "0" / "0"

    def by_threads(mkdir: bool, atomic: bool = False):
        def run() -> dict:
            if not mkdir:
                for v in range(V):
                    for m in range(B):
                        for lead in range(STEPS):
                            chunk_path(v, m, lead).parent.mkdir(parents=True)
                os.sync()
            pool = ThreadPoolExecutor(THREADS, thread_name_prefix="plain")
            pending: list = []
            hosts = [torch.empty(B, V, H, W) for _ in range(3)]  # reused, as ov's

            from zarr.storage._local import _atomic_write

            def put(path: Path, view: np.ndarray) -> None:
                if mkdir:
                    os.makedirs(path.parent, exist_ok=True)
                if atomic:  # Zarr's: a temporary file renamed into place
                    with _atomic_write(path, "wb") as f:
                        f.write(memoryview(view).cast("B"))
                    return
                with open(path, "wb") as f:
                    f.write(memoryview(view).cast("B"))

            def write(x, lead: int) -> None:
                if len(pending) == 3:  # three steps of host copies at most
                    wait(pending.pop(0))
                h = hosts[lead % 3].copy_(x[:, 0, 0]).numpy()  # as OverlappedIO's
                pending.append(
                    [
                        pool.submit(put, chunk_path(v, m, lead), h[m, v])
                        for m in range(B)
                        for v in range(V)
                    ]
                )

            def flush() -> None:
                for fs in pending:
                    for f in fs:
                        f.result()
                pool.shutdown()

            return loop(write, flush)

        return run

    def zarr_async() -> dict:
        import asyncio

        from zarr.api import asynchronous as za

        config = {"async.concurrency": THREADS, "threading.max_workers": THREADS}
        with zarr.config.set(config):
            backend = ZarrBackend(
                str(BASE / "s.zarr"), backend_kwargs={"overwrite": True}
            )
            backend.add_array(total, names)
            runner = asyncio.Runner()
            arrays = [
                runner.run(za.open_array(store=str(BASE / "s.zarr"), path=n, mode="r+"))
                for n in names
            ]
            pending: list = []
            pool = ThreadPoolExecutor(1, thread_name_prefix="loop")
            hosts = [torch.empty(B, 1, 1, V, H, W) for _ in range(3)]

            async def step(h: np.ndarray, lead: int) -> None:
                sel = (slice(0, B), slice(0, 1), slice(lead, lead + 1))
                await asyncio.gather(
                    *(a.setitem(sel, h[:, :, :, v]) for v, a in enumerate(arrays))
                )

            def write(x, lead: int) -> None:
                if len(pending) == 3:
                    pending.pop(0).result()
                h = hosts[lead % 3].copy_(x).numpy()
                pending.append(pool.submit(runner.run, step(h, lead)))

            def flush() -> None:
                for f in pending:
                    f.result()
                pool.submit(runner.close).result()
                pool.shutdown()

            return loop(write, flush)

    rows = {
        "ov": overlapped(None),
        "ov-w8": overlapped(8),
        "ov-settled": overlapped(None, settled=True),
        "threads": by_threads(False),
        "threads-atomic": by_threads(False, atomic=True),
        "threads-mkdir": by_threads(True),
        "zarr-async": zarr_async,
        "upstream": upstream,
    }
    # Interleaved rounds: timings here vary by tens of percent from run to run.
    for k in range(int(os.environ.get("REPEAT", 2))):
        for name, fn in rows.items():
            row(name if k == 0 else f"{name}#{k + 1}", fn, "s.zarr")
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
