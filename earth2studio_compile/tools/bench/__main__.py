"""``python -m earth2studio_compile.tools.bench``: eager vs compiled, fresh processes.

Examples
--------
CPU, small models (CI-sized)::

    python -m earth2studio_compile.tools.bench --small --models fcn,persistence \\
        --steps 10

GPU, operational sizes, with the JSON and the figure::

    python -m earth2studio_compile.tools.bench --models fcn,dlwp,sfno,persistence \\
        --json bench.json --plot bench.png

End to end only, Zarr on local disk, eager vs compiled with one and with parallel
writers, and compiled in TF32::

    python -m earth2studio_compile.tools.bench --models fcn --skip-rollouts \\
        --io zarr-disk --e2e-steps 20 --writers auto --precision tf32

Whole workflow calls as a user makes them, fresh processes and second calls (see
:mod:`.workflow` and ``python -m earth2studio_compile.tools.bench workflow --help``)::

    python -m earth2studio_compile.tools.bench workflow --json workflow.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.e2e import IO_BACKENDS, e2e_table
from earth2studio_compile.tools.bench.env import environment
from earth2studio_compile.tools.bench.measure import AUTO, EAGER
from earth2studio_compile.tools.bench.text import format_table, model_label

DEFAULT_MODELS = "fcn,dlwp,sfno,persistence"
MEASURE = "earth2studio_compile.tools.bench.measure"  # run once per fresh process


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="earth2studio-compile-bench",
        description="Time eager vs torch.compile'd rollouts of Earth2Studio models "
        "(random weights), each model and mode in a fresh process.",
    )
    p.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help=f"comma-separated: fcn, dlwp, sfno, persistence, toy or module:callable "
        f"(default {DEFAULT_MODELS})",
    )
    p.add_argument(
        "--small", action="store_true", help="small grids and networks (CPU)"
    )
    p.add_argument(
        "--modes",
        default=AUTO,
        help="comma-separated compiled modes: auto (the flag's default: "
        "reduce-overhead on CUDA, default on CPU), default, reduce-overhead, "
        "max-autotune, max-autotune-no-cudagraphs (default auto)",
    )
    p.add_argument("--steps", type=int, default=20, help="forecast steps (>= 11)")
    p.add_argument(
        "--e2e-steps",
        type=int,
        default=10,
        help="steps of the end-to-end deterministic workflow with a Zarr store; "
        "0 skips",
    )
    p.add_argument(
        "--io",
        default="",
        help="comma-separated IO backends for the end-to-end profile and overlapped "
        f"writing: {', '.join(IO_BACKENDS)} (default: none); one more fresh process "
        "per model, --e2e-steps steps (20 if 0)",
    )
    p.add_argument(
        "--writers",
        default="auto",
        help="comma-separated parallel-writing rows of the end-to-end profile: auto "
        "(OverlappedIO's default for the backend) or worker counts >= 2, each run "
        "compiled on backends that take parallel writes (default auto); the "
        "one-writer OverlappedIO row is always measured",
    )
    p.add_argument(
        "--skip-rollouts",
        action="store_true",
        help="measure only the end-to-end profile (needs --io)",
    )
    p.add_argument(
        "--fp32",
        action="store_true",
        help="turn TF32 off for cuDNN and matmul (default: PyTorch's defaults, which "
        "let cuDNN convolutions use TF32 on CUDA)",
    )
    p.add_argument(
        "--precision",
        default="",
        help="comma-separated precisions inside the compiled cores: fp32, tf32, bf16 "
        "(default: none, PyTorch's settings). Adds eager and compiled rows per "
        "precision, timed and compared (rel. L2 after steps 1, 10 and N) against "
        "one fp32 eager run with TF32 off",
    )
    p.add_argument(
        "--no-precision-eager",
        dest="precision_eager",
        action="store_false",
        help="with --precision, skip the eager rows of tf32 and bf16 (each row is a "
        "fresh process; the fp32 eager reference always runs)",
    )
    p.add_argument(
        "--aot",
        action="store_true",
        help="add an ahead-of-time row per compiled setup: a fresh process builds the "
        "artifact (python -m earth2studio_compile.tools.build), then a fresh process "
        "with an empty local Inductor cache runs the rollout, which finds it",
    )
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="skip the warm-start run (a second fresh process with an empty local "
        "Inductor cache and the first run's portable cache bundles)",
    )
    p.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument(
        "--ensemble",
        type=int,
        default=0,
        metavar="N",
        help="run upstream's ensemble workflow with N members instead (ensemble/)",
    )
    p.add_argument(
        "--batch-size",
        default="",
        help="with --ensemble: comma-separated members per batch (default N)",
    )
    p.add_argument(
        "--all-variables",
        action="store_true",
        help="with --ensemble: also write every variable at the largest batch size",
    )
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG figure here")
    p.add_argument("--timeout", type=int, default=900, help="seconds per measurement")
    p.add_argument(
        "--render",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="measure nothing: merge these --json files into one table (and --plot)",
    )
    args = p.parse_args(argv)
    if args.ensemble:
        return _parse_ensemble(p, args)
    if args.steps < 11:
        p.error("--steps must be >= 11 (the median of >= 10 steady-state steps)")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu"):
        p.error(f"--device must be cuda or cpu, not {args.device!r}")
    modes = [m for m in args.modes.split(",") if m]
    from earth2studio_compile.options import inductor_modes

    for mode in modes:
        if mode != AUTO and mode not in inductor_modes():
            p.error(f"unknown mode {mode!r}; use auto or one of {inductor_modes()}")
    args.mode_list = modes
    args.precision_list = [x for x in args.precision.split(",") if x]
    from earth2studio_compile.precision import PRECISIONS

    for chosen in args.precision_list:
        if chosen not in PRECISIONS:
            p.error(f"unknown precision {chosen!r}; use {', '.join(PRECISIONS)}")
    if args.precision_list and args.fp32:
        p.error("--precision sets TF32 per row; drop --fp32")
    args.io_list = [b for b in args.io.split(",") if b]
    if args.skip_rollouts and not args.io_list:
        p.error("--skip-rollouts leaves nothing to measure without --io")
    for backend in args.io_list:
        if backend not in IO_BACKENDS:
            p.error(f"unknown IO backend {backend!r}; use {', '.join(IO_BACKENDS)}")
    args.writer_list = []
    for chosen in (w.strip() for w in args.writers.split(",") if w.strip()):
        if chosen != "auto" and not (chosen.isdigit() and int(chosen) >= 2):
            p.error(f"--writers takes auto or worker counts >= 2, not {chosen!r}")
        args.writer_list.append(chosen if chosen == "auto" else int(chosen))
    args.model_list = [m for m in args.models.split(",") if m]
    return args


def _parse_ensemble(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.Namespace:
    """The arguments of ``--ensemble`` (see :mod:`.ensemble`)."""
    from earth2studio_compile.precision import PRECISIONS
    from earth2studio_compile.tools.bench.ensemble import IO_CHOICES

    if args.ensemble < 1 or args.steps < 1:
        p.error("--ensemble and --steps must be >= 1")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = [b.strip() for b in args.batch_size.split(",") if b.strip()]
    if not all(b.isdigit() and int(b) >= 1 for b in sizes):
        p.error(f"--batch-size takes positive integers, not {args.batch_size!r}")
    args.batch_list = sorted({min(int(b), args.ensemble) for b in sizes}) or [
        args.ensemble
    ]
    args.precision_list = [x for x in args.precision.split(",") if x]
    for chosen in args.precision_list:
        if chosen not in PRECISIONS:
            p.error(f"unknown precision {chosen!r}; use {', '.join(PRECISIONS)}")
    args.io_list = [b for b in args.io.split(",") if b]
    for backend in args.io_list:
        if backend not in IO_CHOICES:
            p.error(f"--ensemble writes to {', '.join(IO_CHOICES)}, not {backend!r}")
    args.model_list = [m for m in args.models.split(",") if m]
    return args


def _run_one(spec: dict[str, Any], timeout: int, workdir: Path) -> dict[str, Any]:
    """One measurement in a fresh process with its own, empty local compile caches.

    The package's portable bundles live in one directory per (model, mode), shared
    by the cold run (which writes them) and the warm run (which only reads them):
    that is a warm start on a fresh machine with an empty local cache.
    """
    tag = spec.get("tag") or f"{spec['model'].replace(':', '_')}-{spec['mode']}"
    local = workdir / f"local-{tag}-{spec.get('cache') or 'eager'}"
    env = {
        **os.environ,
        "EARTH2STUDIO_COMPILE_CACHE": str(workdir / f"bundles-{tag}"),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", MEASURE, json.dumps(spec), str(out)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        if proc.returncode != 0 or not out.stat().st_size:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {**spec, "error": " | ".join(tail) or f"exit {proc.returncode}"}
        return json.loads(out.read_text())
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout} s"}
    finally:
        out.unlink(missing_ok=True)


def _build_one(spec: dict[str, Any], timeout: int, workdir: Path) -> dict[str, Any]:
    """Build the ahead-of-time artifacts of ``spec``'s model in a fresh process,
    into the cache root its rows share; ``build_s`` or ``build_error``."""
    tag = f"{spec['model'].replace(':', '_')}-{spec['mode']}"
    local = workdir / f"local-{tag}-build"
    env = {
        **os.environ,
        "EARTH2STUDIO_COMPILE_CACHE": str(workdir / f"bundles-{tag}"),
        "TORCHINDUCTOR_CACHE_DIR": str(local),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    model = spec["model"]
    cmd = [sys.executable, "-m", "earth2studio_compile.tools.build"]
    cmd += ["--module", model] if ":" in model else [model, "--size", spec["size"]]
    if spec.get("device"):
        cmd += ["--device", spec["device"]]
    if spec.get("precision"):
        cmd += ["--precision", spec["precision"]]
    if spec["mode"] not in (AUTO, EAGER):
        cmd += ["--mode", spec["mode"]]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"build_error": f"timed out after {timeout} s"}
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        return {"build_s": seconds, "build_error": " | ".join(tail)}
    return {"build_s": seconds}


def _say_which_path(result: dict[str, Any]) -> None:
    """Mark an ``aot`` row that did not run its artifact, with the reasons."""
    regions = (result.get("report") or {}).get("regions", [])
    declined = [d for r in regions if r.get("executor") != "aot" for d in r["declined"]]
    if regions and any(r.get("executor") != "aot" for r in regions):
        result["cache"] = "aot-declined"
        result["aot_declined"] = declined


def derive(eager: dict[str, Any], comp: dict[str, Any]) -> dict[str, Any]:
    """Speedup and break-even of a compiled run against its eager run."""
    if "error" in eager or "error" in comp:
        return {}
    saved = eager["steady_ms"] - comp["steady_ms"]
    extra = comp["first_step_s"] - eager["first_step_s"]
    out = {"speedup": eager["steady_ms"] / comp["steady_ms"]}
    # First step n at which compiled cumulative time <= eager cumulative time.
    out["break_even_steps"] = (1 + max(0.0, extra) * 1e3 / saved) if saved > 0 else None
    if eager.get("peak_gpu_bytes") and comp.get("peak_gpu_bytes"):
        out["memory_ratio"] = comp["peak_gpu_bytes"] / eager["peak_gpu_bytes"]
    return out


def _against_eager(
    results: list[dict[str, Any]],
    model: str,
    chosen: str | None,
    result: dict[str, Any],
) -> dict[str, Any]:
    """Speedup against the first eager run (with --precision, fp32 with TF32 off);
    break-even against eager in the same precision where that was run, since that
    is what a user who already runs in that precision would compare with."""
    eagers = [r for r in results if r["model"] == model and r["mode"] == EAGER]
    out = derive(eagers[0], result)
    same = next((r for r in eagers if r.get("precision") == chosen), None)
    if same is not None and same is not eagers[0] and result["mode"] != EAGER:
        out["break_even_steps"] = derive(same, result).get("break_even_steps")
        out["break_even_against"] = f"eager {chosen}"
    return out


#: Forecast lengths of the totals table: 10, 15 and 60 days at 6 h steps.
FORECAST_STEPS = (40, 60, 240)
#: Members of the ensemble row, each ``FORECAST_STEPS[0]`` steps, one session.
ENSEMBLE = 16


def forecast_totals(results: list[dict[str, Any]]) -> str:
    """Total seconds of whole forecasts, eager vs compiled, cold and warm.

    Derived from the rows: first step + (N - 1) x median step. The ensemble row is
    ``ENSEMBLE`` members of ``FORECAST_STEPS[0]`` steps run in one session, so it
    compiles once.
    """
    header = ["model", "mode", "cache"] + [f"{n} steps s" for n in FORECAST_STEPS]
    header.append(f"{ENSEMBLE}x{FORECAST_STEPS[0]} ens. s")
    rows = []
    for r in results:
        if "error" in r or r.get("steady_ms") is None:
            continue
        counts = [*FORECAST_STEPS, ENSEMBLE * FORECAST_STEPS[0]]
        totals = [r["first_step_s"] + (n - 1) * r["steady_ms"] / 1e3 for n in counts]
        rows.append(
            [model_label(r), r["mode"], r.get("cache") or ""]
            + [f"{t:.2f}" for t in totals]
        )
    return format_table(header, rows)


def _row(r: dict[str, Any]) -> list[str]:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    if "error" in r:
        return [model_label(r), r["mode"], "", "error: " + r["error"][:60]] + [""] * 10
    regions = (r.get("report") or {}).get("regions", [])
    graphs = sum(x["graphs"] for x in regions) if regions else None
    breaks = sum(x["graph_breaks"] for x in regions) if regions else None
    recompiles = sum(x["recompiles"] for x in regions) if regions else None
    status = ",".join(sorted({x["status"] for x in regions})) if regions else "eager"
    mem = r.get("peak_gpu_bytes")
    return [
        model_label(r),
        r["mode"],
        r.get("cache") or "",
        status,
        f(r["first_step_s"], ".2f"),
        f(r["steady_ms"], ".2f"),
        f(r.get("speedup"), ".2f"),
        f(r.get("break_even_steps"), ".0f"),
        f(mem / 2**30 if mem else None, ".2f"),
        f"{f(graphs, 'd')}/{f(breaks, 'd')}/{f(recompiles, 'd')}",
        f(r.get("rel_l2_first"), ".1e"),
        f(r.get("rel_l2_10"), ".1e"),
        f(r.get("rel_l2_last"), ".1e"),
        f(r.get("e2e_s"), ".2f"),
    ]


HEADER = [
    "model",
    "mode",
    "cache",
    "status",
    "first s",
    "ms/step",
    "speedup",
    "break-even",
    "peak GiB",
    "graphs/breaks/recomp",
    "relL2@1",
    "relL2@10",
    "relL2@N",
    "e2e s",
]


def table(results: list[dict[str, Any]]) -> str:
    """Plain-text table of the results."""
    return format_table(HEADER, [_row(r) for r in results])


def _phases(r: dict[str, Any]) -> str:
    """``"; bundle_load 0.31 s, dynamo 2.10 s, ..."`` summed over regions."""
    total: dict[str, float] = {}
    for region in (r.get("report") or {}).get("regions", []):
        for k, v in (region.get("phases") or {}).items():
            total[k] = total.get(k, 0.0) + v
    return "".join(f", {k} {v:.2f} s" for k, v in total.items()).replace(", ", "; ", 1)


def _start_kind(r: dict[str, Any]) -> str:
    if r.get("cache") != "aot":
        return "warm start"
    built = f" (built beforehand in {r['build_s']:.0f} s)" if r.get("build_s") else ""
    return f"ahead-of-time start{built}"


def _precision_of(r: dict[str, Any]) -> str:
    return f" {r['precision']}" if r.get("precision") else ""


def warm_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per warm start: first step warm vs cold, and where it went."""
    return [
        f"{_start_kind(r)} {r['model']} {r['mode']}{_precision_of(r)}: first step "
        f"{r['first_step_s']:.2f} s vs "
        f"{r['first_step_s'] / r['warm_over_cold']:.2f} s cold "
        f"({100 * r['warm_over_cold']:.0f}%){_phases(r)}"
        for r in results
        if r.get("warm_over_cold")
    ]


def render(paths: list[Path], plot_path: Path | None) -> int:
    """Print (and plot) the merged results of earlier ``--json`` files."""
    runs = [json.loads(p.read_text()) for p in paths]
    results = [r for run in runs for r in run.get("results", [])]
    ensemble = [r for run in runs for r in run.get("ensemble", [])]
    if results:
        print(table(results))
        print("\n".join(warm_lines(results)))
        print(forecast_totals(results))
    if ensemble:  # --ensemble runs, merged: the summary compares across files
        from earth2studio_compile.tools.bench.ensemble import tables

        print(tables(ensemble))
    for p, run in zip(paths, runs):
        env = run["environment"]
        print(
            f"{p.name}: {env.get('gpu', 'CPU')}, driver {env.get('driver')}, torch "
            f"{env['torch']}, triton {env['triton']}, {env['date']}"
        )
    if plot_path:
        from earth2studio_compile.tools.bench.plot import plot

        plot(results, plot_path, title=runs[0]["environment"].get("gpu", "CPU"))
    return 0


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``earth2studio-compile-bench``."""
    from tqdm import tqdm

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["workflow"]:  # whole workflow calls: its own mode and options
        from earth2studio_compile.tools.bench.workflow import main as workflow

        return workflow(argv[1:])
    args = _parse(argv)
    if args.render:
        return render(args.render, args.plot)
    if args.ensemble:
        from earth2studio_compile.tools.bench.ensemble import run_rows

        return run_rows(args, environment(args.device), _run_one)
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
                # The first eager run of a model is the reference the others meet.
                "save_reference": mode == EAGER
                and not any(r["model"] == model for r in results),
            }
            built = _build_one(spec, args.timeout, Path(tmp)) if cache == "aot" else {}
            result = {**_run_one(spec, args.timeout, Path(tmp)), **built}
            if cache == "aot":
                _say_which_path(result)
            if mode != EAGER or chosen not in (None, "fp32"):
                result.update(_against_eager(results, model, chosen, result))
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
            result = _run_one(spec, args.timeout, Path(tmp))
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


if __name__ == "__main__":
    sys.exit(main())
