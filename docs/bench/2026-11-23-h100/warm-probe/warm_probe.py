"""Where does a warm first step go, and what does AOTInductor cost? (exploration)"""
import cProfile, io, json, os, pstats, sys, time, shutil
role, name = sys.argv[1], sys.argv[2]
out = os.environ.get("OUT", "/tmp")
root = f"/tmp/e2sc-probe-{name}"
os.environ["EARTH2STUDIO_COMPILE_CACHE"] = root
if role == "warm":
    shutil.rmtree(f"{root}/inductor", ignore_errors=True)
if role == "aoti":
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"/tmp/aoti-fresh-{name}"
t0 = time.perf_counter()
import torch
from earth2studio_compile import CompileSession
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.runs import initial_state
from earth2studio_compile.metrics import synchronize
print(f"[{role} {name}] imports {time.perf_counter()-t0:.1f} s", flush=True)
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = zoo.build(name, size=("full" if dev.type == "cuda" else "small")).to(dev)
x, coords = initial_state(model, dev)
core = model.model
res = {"role": role, "model": name}

def steps(n, prof_first=False):
    it = model.create_iterator(x, coords); next(it)
    times = []
    for i in range(n):
        synchronize(dev); s = time.perf_counter()
        if prof_first and i == 0:
            pr = cProfile.Profile(); pr.enable()
        y, _ = next(it)
        synchronize(dev)
        if prof_first and i == 0:
            pr.disable()
            buf = io.StringIO(); pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(60)
            print(buf.getvalue()[:12000])
            buf = io.StringIO(); pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
            print(buf.getvalue()[:6000])
        times.append(time.perf_counter() - s)
    it.close()
    return times, y

if role in ("cold", "warm"):
    with CompileSession(model) as s:
        t, y = steps(8, prof_first=(role == "warm"))
    res["steps"] = t; res["report"] = s.report.to_dict()
    print(f"[{role} {name}] steps", [round(v, 4) for v in t], flush=True)
    print(s.report.summary())
    try:
        import torch._dynamo.utils as du
        print(du.compile_times(repr="str", aggregate=True))
    except Exception as e:
        print("compile_times", e)
    if role == "cold":
        # capture core input
        got = {}
        h = core.register_forward_pre_hook(lambda m, a: got.setdefault("a", a))
        with torch.inference_mode():
            steps(1)
        h.remove()
        a = tuple(t.clone() for t in got["a"])
        torch.save(a, f"/tmp/core-in-{name}.pt")
        s0 = time.perf_counter()
        with torch.no_grad():
            ep = torch.export.export(core, a, strict=False)
        res["export_s"] = time.perf_counter() - s0
        s0 = time.perf_counter()
        from torch._inductor import aoti_compile_and_package
        path = aoti_compile_and_package(ep, package_path=f"/tmp/aoti-{name}.pt2",
            inductor_configs={"aot_inductor.package_constants_in_so": False})
        res["aoti_compile_s"] = time.perf_counter() - s0
        res["aoti_size_mb"] = os.path.getsize(path) / 1e6
        print(f"[cold {name}] export {res['export_s']:.1f} s aoti {res['aoti_compile_s']:.1f} s {res['aoti_size_mb']:.1f} MB", flush=True)
elif role == "aoti":
    a = tuple(t.to(dev) for t in torch.load(f"/tmp/core-in-{name}.pt"))
    with torch.no_grad():
        ref = core(*a)
    synchronize(dev)
    s0 = time.perf_counter()
    from torch._inductor import aoti_load_package
    runner = aoti_load_package(f"/tmp/aoti-{name}.pt2", run_single_threaded=True)
    res["load_s"] = time.perf_counter() - s0
    fqns = runner.get_constant_fqns()
    named = dict(core.named_parameters()); named.update(dict(core.named_buffers()))
    s0 = time.perf_counter()
    runner.load_constants({k: named[k] for k in fqns}, check_full_update=True, user_managed=True)
    res["constants_s"] = time.perf_counter() - s0
    res["missing_fqns"] = [k for k in fqns if k not in named][:5]
    s0 = time.perf_counter()
    o = runner(*a); synchronize(dev)
    res["first_call_s"] = time.perf_counter() - s0
    o = o[0] if isinstance(o, (list, tuple)) else o
    res["rel_l2_vs_eager"] = ((o - ref).norm() / ref.norm()).item()
    ts = []
    for _ in range(10):
        synchronize(dev); s0 = time.perf_counter(); runner(*a); synchronize(dev); ts.append(time.perf_counter() - s0)
    res["aoti_ms"] = sorted(ts)[5] * 1e3
    ts = []
    with torch.no_grad():
        for _ in range(10):
            synchronize(dev); s0 = time.perf_counter(); core(*a); synchronize(dev); ts.append(time.perf_counter() - s0)
    res["eager_ms"] = sorted(ts)[5] * 1e3
    # CUDA graph around the AOTI call
    try:
        static = tuple(t.clone() for t in a)
        st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for _ in range(2): runner(*static)
        torch.cuda.current_stream().wait_stream(st)
        g = torch.cuda.CUDAGraph()
        s0 = time.perf_counter()
        with torch.cuda.graph(g):
            gout = runner(*static)
        synchronize(dev)
        res["capture_s"] = time.perf_counter() - s0
        ts = []
        for _ in range(10):
            synchronize(dev); s0 = time.perf_counter(); g.replay(); synchronize(dev); ts.append(time.perf_counter() - s0)
        res["graph_ms"] = sorted(ts)[5] * 1e3
        go = gout[0] if isinstance(gout, (list, tuple)) else gout
        res["graph_rel_l2"] = ((go - ref).norm() / ref.norm()).item()
        # weights change is seen?
        with torch.no_grad():
            p = next(core.parameters()); p.mul_(1.01)
            ref2 = core(*a)
        o2 = runner(*a); o2 = o2[0] if isinstance(o2, (list, tuple)) else o2
        res["weights_follow_rel_l2"] = ((o2 - ref2).norm() / ref2.norm()).item()
    except Exception as e:
        res["capture_error"] = repr(e)[:500]
    print(json.dumps(res, indent=1), flush=True)
json.dump(res, open(f"{out}/{role}-{name}.json", "w"), indent=1, default=str)
