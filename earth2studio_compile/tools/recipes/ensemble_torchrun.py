"""Recipe: an ensemble spread over ranks with ``torchrun``, compiled once for all.

Each rank runs its share of the members through
:func:`earth2studio_compile.run.ensemble` with ``compile=True`` and writes its own
Zarr store (``OUT/rank<R>.zarr``). All ranks share one compile cache root
(``EARTH2STUDIO_COMPILE_CACHE``, by default ``~/.cache/earth2studio/compile``): the
first rank to reach a region compiles it and saves its bundle, the others wait for
that rank's lock and load the bundle. ``torchrun`` starts the ranks and
``torch.distributed`` tells each its share; nothing else is shared between them.

    torchrun --nproc_per_node 2 \\
        -m earth2studio_compile.tools.recipes.ensemble_torchrun \\
        --out outputs --nensemble 8 --nsteps 4

The model and data come from the zoo (random weights and data, no downloads, see
:mod:`earth2studio_compile.tools.zoo`); in your own run, put your prognostic and
data source in :func:`model_and_data`. Rank 0 prints what each rank did with each
compiled region: ``saved`` (it compiled), ``loaded after waiting N s`` (another
rank compiled it), or ``loaded`` (a bundle from an earlier run). Ranks with different
numbers of members run different batch sizes, which are different region keys: each
such rank compiles its own.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

TIME = ["2024-01-01T00:00"]


def members(rank: int, world_size: int, nensemble: int) -> np.ndarray:
    """The ensemble members rank ``rank`` of ``world_size`` runs.

    Parameters
    ----------
    rank, world_size : int
        This process's rank and the number of ranks
    nensemble : int
        Members in the whole ensemble

    Returns
    -------
    np.ndarray
        Contiguous member indices (possibly empty)
    """
    return np.array_split(np.arange(nensemble), world_size)[rank]


def model_and_data(name: str, size: str, seed: int) -> tuple[Any, Any]:
    """The prognostic model and the data source (the zoo's, for this recipe)."""
    from earth2studio_compile.tools import zoo

    model = zoo.build(name, size=size, seed=seed)
    return model, zoo.random_source(model)


def run_rank(
    rank: int,
    world_size: int,
    out: Path,
    nensemble: int = 4,
    nsteps: int = 2,
    model_name: str = "fcn",
    size: str = "small",
    seed: int = 0,
    compile: bool = True,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Run rank ``rank``'s members and write them to ``out/rank<rank>.zarr``.

    Parameters
    ----------
    rank, world_size : int
        This process's rank and the number of ranks
    out : Path
        Directory of the per-rank Zarr stores
    nensemble, nsteps : int, optional
        Members in the whole ensemble, forecast steps
    model_name, size : str, optional
        Zoo model and size
    seed : int, optional
        Seed of the data and of the model's random weights; a rank's perturbation
        is seeded with ``seed`` plus its first member's index, so each rank's
        members differ and a rerun repeats them
    compile : bool, optional
        Compile the model's core network, by default True
    device : torch.device | None, optional
        By default ``cuda:<LOCAL_RANK>`` where CUDA is available, else the CPU

    Returns
    -------
    dict[str, Any]
        ``rank``, ``members`` and, when compiled, what happened to each region's
        bundle (``artifact``) and its Inductor cache state (``cache``)
    """
    # The package's run module first: it imports Earth2Studio without the stack
    # walks of its optional-dependency registry (earth2studio_compile._imports),
    # which would otherwise be paid here, ~30 s a rank on a 2-core CPU.
    from earth2studio_compile.run import ensemble, last_report

    # isort: split
    from earth2studio.io import ZarrBackend
    from earth2studio.perturbation import Gaussian

    mine = members(rank, world_size, nensemble)
    result: dict[str, Any] = {"rank": rank, "members": mine.tolist(), "regions": {}}
    if not len(mine):
        return result
    if device is None:
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    model, data = model_and_data(model_name, size, seed)
    np.random.seed(seed)  # the data source draws from numpy
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    io = ZarrBackend(str(out / f"rank{rank}.zarr"), backend_kwargs={"overwrite": True})
    ensemble(
        TIME,
        nsteps,
        len(mine),
        model,
        data,
        io,
        Gaussian(noise_amplitude=0.05, seed=seed + int(mine[0])),
        batch_size=len(mine),
        device=device,
        verbose=False,
        compile=compile,
    )
    report = last_report() if compile else None
    if report is not None:
        result["regions"] = {
            r.label: {"artifact": r.artifact, "cache": r.cache, "status": r.status}
            for r in report.regions
        }
    return result


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, join the process group, run this rank, gather."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nensemble", type=int, default=4)
    parser.add_argument("--nsteps", type=int, default=2)
    parser.add_argument("--model", default="fcn")
    parser.add_argument("--size", default="small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args(argv)

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        result = run_rank(
            rank,
            world_size,
            args.out,
            args.nensemble,
            args.nsteps,
            args.model,
            args.size,
            args.seed,
            args.compile,
        )
        results: list[Any] = [None] * world_size
        dist.all_gather_object(results, result)
        if rank == 0:
            for r in results:
                regions = ", ".join(
                    f"{label}: {v['artifact']}" for label, v in r["regions"].items()
                )
                print(f"rank {r['rank']} members {r['members']}: {regions or '-'}")
            (args.out / "ranks.json").write_text(json.dumps(results, indent=1))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
