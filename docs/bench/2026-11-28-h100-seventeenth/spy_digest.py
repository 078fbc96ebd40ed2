"""A digest of a py-spy raw profile (``py-spy record -f raw``, gzipped or not): the
samples of each kind of thread (a pool's threads counted together), the stacks they
were in (their innermost frames), and, for a profile taken with ``--native``, how
many of each kind's samples waited for the GIL: a CPython frame of its GIL (such as
``take_gil``) inside the innermost Python frame, or only the C library's condition
wait there (where CPython's GIL functions have no symbols: a Python frame that
called nothing blocking, waiting).

The seventeenth session's digests (``spy-*-digest-*.txt``) were made this way.

Run: ``python3 spy_digest.py PROFILE [--process TEXT] [--depth N] [--top N]``;
``--process`` keeps only the samples of the processes whose command line holds TEXT
(a profile taken with ``--subprocesses``), e.g. '"run": "compiled"'.
"""

import argparse
import collections
import gzip
import re
import sys

#: Native frames of a thread waiting for (or handing over) CPython's GIL.
GIL = ("take_gil", "drop_gil", "PyEval_RestoreThread", "PyEval_AcquireThread")
#: Stacks of imports: the process starting, not the workflow.
IMPORTS = ("_find_and_load", "getmodule", "source_to_code")


def waits_for_the_gil(frames: list[str]) -> bool:
    """Whether a ``--native`` stack (outermost first) waits for the GIL."""
    python = [i for i, f in enumerate(frames) if ".py:" in f]
    inner = frames[python[-1] + 1 :] if python else []
    if any(g in f for f in inner for g in GIL):
        return True
    in_libc = all("(libc.so" in f or "(libpthread" in f for f in inner)
    return bool(inner) and in_libc and any("pthread_cond" in f for f in inner)


def frame_name(frame: str) -> str:
    """``function (file:line)`` as ``function``, with the line for this package."""
    name, _, where = frame.partition(" (")
    return f"{name}({where}" if "earth2studio" in where else name


def digest(path: str, process: str | None, depth: int, top: int) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    threads: collections.Counter = collections.Counter()
    gil: collections.Counter = collections.Counter()
    stacks: dict[str, collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            procs = [p for p in frames if p.startswith("process ")]
            frames = [p for p in frames if not p.startswith("process ")]
            if process and not (procs and process in procs[-1]):
                continue
            if not frames or any(k in stack for k in IMPORTS):
                continue
            thread = re.sub(r"\(\d+\)", "", frames[0])
            thread = re.sub(r"(_\d+| \d+)$", "_N", re.sub(r"lane \d+", "lane", thread))
            n = int(count)
            threads[thread] += n
            inner = frames[-depth:][::-1]
            if waits_for_the_gil(frames):
                gil[thread] += n
            stacks[thread][" <- ".join(frame_name(p) for p in inner)] += n
    out = []
    for thread, n in threads.most_common():
        waits = f", waiting for the GIL in {gil[thread]}" if gil else ""
        out.append(f"== {thread}: {n} samples{waits}")
        for stack, c in stacks[thread].most_common(top):
            out.append(f"   {c:6d} {stack[:260]}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--process")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    print(digest(args.profile, args.process, args.depth, args.top))


if __name__ == "__main__":
    sys.exit(main())
