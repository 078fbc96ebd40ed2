"""AOTInductor on the GPU's torch: build, then load in a fresh process (exploration).

python aot_probe.py build NAME PREC   # export + aoti_compile_and_package, saves inputs and refs
python aot_probe.py load NAME PREC    # fresh process, empty Inductor cache: raw package loader
"""
import json, os, sys, time

role, name, prec = sys.argv[1], sys.argv[2], sys.argv[3]
out = os.environ.get("OUT", "/tmp")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"/tmp/aot-ind-{role}-{name}-{prec}"
t0 = time.perf_counter()
import torch
res = {"role": role, "model": name, "precision": prec, "torch": torch.__version__}
res["import_torch_s"] = time.perf_counter() - t0
dev = torch.device("cuda")
pkg = f"/tmp/aot-{name}-{prec}.pt2"
data = f"/tmp/aot-{name}-{prec}-data.pt"


def flags(p):
    torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
    torch.backends.cudnn.allow_tf32 = p == "tf32"


def sync():
    torch.cuda.synchronize()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def med(f, n=10):
    ts = []
    for _ in range(n):
        sync(); s = time.perf_counter(); f(); sync(); ts.append(time.perf_counter() - s)
    return sorted(ts)[n // 2] * 1e3


if role == "build":
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.runs import initial_state
    model = zoo.build(name, size="full").to(dev)
    x, coords = initial_state(model, dev)
    core = model.model
    got = {}
    h = core.register_forward_pre_hook(lambda m, a: got.setdefault("a", a))
    with torch.inference_mode():
        it = model.create_iterator(x, coords); next(it); next(it); it.close()
    h.remove()
    a = tuple(t.clone() for t in got["a"])
    flags("fp32")
    with torch.no_grad():
        ref32 = core(*a)
    flags(prec)
    with torch.no_grad():
        refp = core(*a)
    s = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(core, a, strict=False)
    res["export_s"] = time.perf_counter() - s
    from torch._inductor import aoti_compile_and_package
    s = time.perf_counter()
    path = aoti_compile_and_package(ep, package_path=pkg, inductor_configs={
        "aot_inductor.package_constants_in_so": False})
    res["package_s"] = time.perf_counter() - s
    res["package_mb"] = os.path.getsize(path) / 1e6
    torch.save({"a": [t.cpu() for t in a], "ref32": ref32.cpu(), "refp": refp.cpu(),
                "state": {k: v.cpu() for k, v in core.state_dict().items()}}, data)
    res["input_shapes"] = [list(t.shape) for t in a]
elif role == "load":
    d = torch.load(data)
    a = tuple(t.to(dev) for t in d["a"])
    state = {k: v.to(dev) for k, v in d["state"].items()}
    flags(prec)
    torch.zeros(1, device=dev); sync()
    s = time.perf_counter()
    loader = torch._C._aoti.AOTIModelPackageLoader(pkg, "model", False, 1, dev.index or 0)
    res["loader_s"] = time.perf_counter() - s
    try:
        from torch._inductor.package.package import AOTICompiledModel
    except ImportError:
        from torch.export.pt2_archive._package import AOTICompiledModel
    runner = AOTICompiledModel(loader)
    fqns = runner.get_constant_fqns()
    res["n_constants"] = len(fqns)
    res["missing"] = [k for k in fqns if k not in state][:5]
    s = time.perf_counter()
    runner.load_constants({k: state[k] for k in fqns}, check_full_update=True, user_managed=True)
    res["bind_s"] = time.perf_counter() - s
    s = time.perf_counter()
    o = runner(*a); sync()
    res["first_call_s"] = time.perf_counter() - s
    o = o[0] if isinstance(o, (list, tuple)) else o
    res["rel_vs_same_prec"] = rel(o, d["refp"].to(dev))
    res["rel_vs_fp32"] = rel(o, d["ref32"].to(dev))
    res["aoti_ms"] = med(lambda: runner(*a))
    static = tuple(t.clone() for t in a)
    st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        runner(*static)
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    s = time.perf_counter()
    with torch.cuda.graph(g):
        gout = runner(*static)
    sync()
    res["capture_s"] = time.perf_counter() - s
    res["graph_ms"] = med(g.replay)
    go = gout[0] if isinstance(gout, (list, tuple)) else gout
    res["graph_rel_vs_same_prec"] = rel(go, d["refp"].to(dev))
    # eager in this fresh process, same precision: first call and steady
    from earth2studio_compile.tools import zoo
    core = zoo.build(name, size="full").model.to(dev)
    core.load_state_dict(state)
    with torch.no_grad():
        s = time.perf_counter(); core(*a); sync(); res["eager_first_s"] = time.perf_counter() - s
        res["eager_ms"] = med(lambda: core(*a))
    # weights follow (user-managed constants: same storage as `state`)
    with torch.no_grad():
        k = next(k for k in fqns if state[k].is_floating_point())
        state[k].mul_(1.01)
        core.load_state_dict(state)
        o2 = runner(*a); o2 = o2[0] if isinstance(o2, (list, tuple)) else o2
        r2 = core(*a)
    res["weights_follow_rel"] = rel(o2, r2)
res["total_s"] = time.perf_counter() - t0
print(json.dumps(res, indent=1), flush=True)
json.dump(res, open(f"{out}/{role}-{name}-{prec}.json", "w"), indent=1)
