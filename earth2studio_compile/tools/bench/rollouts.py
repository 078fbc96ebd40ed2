"""The rollout mode's runner: eager and compiled rows, then the end-to-end profile.

:func:`run_rollouts` plans the rows (per model: eager, then each mode cold, warm and
ahead-of-time, per precision), runs each in a fresh process (the CLI hands over
:func:`.processes.run_one`), derives the figures against eager, writes the JSON after
every row and prints the tables (:mod:`.results`).
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.e2e import e2e_table
from earth2studio_compile.tools.bench.env import environment
from earth2studio_compile.tools.bench.measure import EAGER
from earth2studio_compile.tools.bench.processes import say_which_path
from earth2studio_compile.tools.bench.results import (
    against_eager,
    forecast_totals,
    table,
    warm_lines,
)

#: Runs one spec in a fresh process: ``(spec, timeout, workdir) -> row``.
Runner = Callable[[dict[str, Any], int, Path], dict[str, Any]]


def _e2e_text(result: dict[str, Any]) -> str:
    """One model's end-to-end table, or the error that took its place."""
    if "e2e" in result:
        return e2e_table(result["model"], result["e2e"])
    return f"{result['model']} end to end: {result['error']}"


def _compiled_anything(results: list[dict[str, Any]], model: str, mode: str) -> bool:
    cold = [r for r in results if r["model"] == model and r["mode"] == mode]
    regions = [x for r in cold for x in (r.get("report") or {}).get("regions", [])]
    return any(x["status"] == "compiled" for x in regions)


def _write_json(
    path: Path,
    env: dict[str, Any],
    results: list[dict[str, Any]],
    e2e: list[dict[str, Any]],
) -> None:
    payload = {"environment": env, "argv": sys.argv, "results": results, "e2e": e2e}
    path.write_text(json.dumps(payload, indent=2))


def run_rollouts(args: Any, run_one: Runner, build_one: Runner) -> int:
    """The rollout mode (and ``--io``'s end-to-end profile), each row a fresh process.

    Parameters
    ----------
    args : argparse.Namespace
        The CLI's parsed arguments (:func:`.arguments.parse`)
    run_one : Runner
        Runs one spec in a fresh process (the CLI's ``_run_one``)
    build_one : Runner
        Builds a spec's ahead-of-time artifacts in a fresh process (``--aot``)

    Returns
    -------
    int
        The exit status: 1 if a row failed
    """
    from tqdm import tqdm

    size = "small" if args.small else "full"
    results: list[dict[str, Any]] = []
    caches = ["cold", "warm"] if args.warm else ["cold"]
    aot = ["aot"] if args.aot else []
    caches += aot
    runs: list[tuple[str, str | None, str | None]] = [(EAGER, None, None)]
    runs += [(x, c, None) for x in args.mode_list for c in caches]
    if args.precision_list:
        # The reference first: fp32 eager, TF32 off. Reduced precisions run cold:
        # their warm start is the fp32 one's.
        runs = [(EAGER, None, "fp32")]
        for chosen in args.precision_list:
            if chosen != "fp32" and args.precision_eager:
                runs.append((EAGER, None, chosen))
            c_list = caches if chosen == "fp32" else ["cold", *aot]
            runs += [(x, c, chosen) for x in args.mode_list for c in c_list]
    plan = [(m, *run) for m in args.model_list for run in runs]
    if args.skip_rollouts:
        plan = []
    e2e: list[dict[str, Any]] = []
    if args.fp32:
        import torch

        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    env = environment(args.device)
    total = len(plan) + (len(args.model_list) if args.io_list else 0)
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=total, desc="bench") as bar:
        for model, mode, cache, chosen in plan:
            if cache in ("warm", "aot") and not _compiled_anything(
                results, model, mode
            ):
                bar.update(1)  # nothing was compiled, so there is nothing to warm-start
                continue
            bar.set_postfix_str(f"{model} {mode} {cache or ''}".rstrip())
            spec = {
                "model": model,
                "mode": mode,
                "cache": cache,
                "size": size,
                "device": args.device,
                "steps": args.steps,
                "fp32": args.fp32,
                # End to end once per mode: a warm start changes only the first step.
                "e2e_steps": 0 if cache == "warm" else args.e2e_steps,
                "reference": str(Path(tmp) / f"{model.replace(':', '_')}.pt"),
                "precision": chosen,
                "attention": list(args.attention)
                if args.attention and mode != EAGER
                else None,
                # The first eager run of a model is the reference the others meet.
                "save_reference": mode == EAGER
                and not any(r["model"] == model for r in results),
            }
            built = build_one(spec, args.timeout, Path(tmp)) if cache == "aot" else {}
            result = {**run_one(spec, args.timeout, Path(tmp)), **built}
            if cache == "aot":
                say_which_path(result)
            if mode != EAGER or chosen not in (None, "fp32"):
                result.update(against_eager(results, model, chosen, result))
            if cache in ("warm", "aot"):
                cold = next(
                    r
                    for r in results
                    if r["model"] == model
                    and r["mode"] == mode
                    and r.get("cache") == "cold"
                    and r.get("precision") == chosen
                )
                if "error" not in cold and "error" not in result:
                    first, cold_first = result["first_step_s"], cold["first_step_s"]
                    result["warm_over_cold"] = first / cold_first
            result.pop("reference", None)
            result.pop("save_reference", None)
            results.append(result)
            bar.write(table([result]).splitlines()[-1])
            if args.json:  # after every run, so a run cut short keeps what it measured
                _write_json(args.json, env, results, e2e)
            bar.update(1)
        for model in args.model_list if args.io_list else []:
            bar.set_postfix_str(f"{model} end to end")
            spec = {
                "model": model,
                "mode": "e2e",
                "size": size,
                "device": args.device,
                "steps": args.e2e_steps or 20,
                "fp32": args.fp32,
                "io": args.io_list,
                "writers": args.writer_list,
                "precisions": args.precision_list,
            }
            result = run_one(spec, args.timeout, Path(tmp))
            e2e.append(result)
            bar.write(_e2e_text(result))
            if args.json:
                _write_json(args.json, env, results, e2e)
            bar.update(1)
    print(table(results))
    print("\n".join(warm_lines(results)))
    if results:
        print(
            "\nWhole forecasts (first step + (N - 1) x median step, from the rows "
            "above):"
        )
        print(forecast_totals(results))
    for r in e2e:
        print("\n" + _e2e_text(r))
    print(
        f"\n{env.get('gpu') or platform.processor() or 'CPU'}, torch {env['torch']}, "
        f"triton {env['triton']}, {size} models, {args.steps} steps, "
        f"TF32 convolutions {'on' if env['cudnn_allow_tf32'] else 'off'}, {env['date']}"
    )
    if args.plot:
        from earth2studio_compile.tools.bench.plot import plot

        plot(results, args.plot, title=f"{env.get('gpu') or 'CPU'} ({size})")
    return 1 if any("error" in r for r in results + e2e) else 0
