"""Inductor's local compile cache: where it is, its hits and misses, moving it."""

from __future__ import annotations

import os
import sys

from earth2studio_compile._torch.probes import missing


def fx_cache_counts() -> tuple[int, int]:
    """(FX-graph cache hits, misses) so far in this process; (0, 0) if unknown."""
    if missing("counters"):
        return 0, 0
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"][
        "fxgraph_cache_miss"
    ]


def inductor_cache_dir() -> str:
    """Inductor's local cache directory in effect (it creates it if needed)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def default_inductor_cache_dir() -> str | None:
    """Where Inductor puts its cache when ``TORCHINDUCTOR_CACHE_DIR`` is unset."""
    if missing("cache_dir"):
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def forget_local_cache_paths() -> None:
    """Drop Inductor's memoized local cache paths (after the directory moved)."""
    codecache = sys.modules.get("torch._inductor.codecache")
    clear = getattr(
        getattr(getattr(codecache, "CacheBase", None), "get_local_cache_path", None),
        "cache_clear",
        None,
    )
    if clear is not None:
        clear()
