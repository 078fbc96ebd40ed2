import time, torch, json, os
d = torch.device("cuda")
print(torch.cuda.get_device_name(), flush=True)
res = {}
def bw(nbytes, pinned, reps=10, stream=None):
    src = torch.randn(nbytes // 4, device=d)
    dst = torch.empty(nbytes // 4, pin_memory=pinned)
    for _ in range(2):
        dst.copy_(src, non_blocking=pinned)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=pinned)
    torch.cuda.synchronize()
    return nbytes * reps / (time.perf_counter() - t0) / 1e9
for mb in (4, 33, 100, 300):
    res[f"pinned_{mb}MB_GBps"] = bw(mb * 2**20, True)
    res[f"pageable_{mb}MB_GBps"] = bw(mb * 2**20, False, reps=3)
    print(mb, res[f"pinned_{mb}MB_GBps"], res[f"pageable_{mb}MB_GBps"], flush=True)
# H2D
src = torch.empty(100 * 2**18, pin_memory=True); dst = torch.empty(100 * 2**18, device=d)
dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10): dst.copy_(src, non_blocking=True)
torch.cuda.synchronize(); res["h2d_pinned_100MB_GBps"] = 100 * 2**20 * 10 / (time.perf_counter() - t0) / 1e9
# overlap: matmul on default stream while copying on a side stream
a = torch.randn(8192, 8192, device=d)
side = torch.cuda.Stream()
srcs = [torch.randn(25 * 2**20, device=d) for _ in range(3)]
dsts = [torch.empty(25 * 2**20, pin_memory=True) for _ in range(3)]
def mm(n):
    for _ in range(n): a @ a
torch.cuda.synchronize(); t0 = time.perf_counter(); mm(20); torch.cuda.synchronize(); res["mm20_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
for s_, d_ in zip(srcs, dsts): d_.copy_(s_, non_blocking=True)
torch.cuda.synchronize(); res["copy3x100MB_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
with torch.cuda.stream(side):
    for s_, d_ in zip(srcs, dsts): d_.copy_(s_, non_blocking=True)
mm(20); torch.cuda.synchronize(); res["both_side_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
for s_, d_ in zip(srcs, dsts): d_.copy_(s_, non_blocking=True)
mm(20); torch.cuda.synchronize(); res["both_serial_s"] = time.perf_counter() - t0
# pinned alloc cost
t0 = time.perf_counter(); x = torch.empty(100 * 2**18, pin_memory=True); res["pin_alloc_100MB_s"] = time.perf_counter() - t0
t0 = time.perf_counter(); x = torch.empty(300 * 2**18, pin_memory=True); res["pin_alloc_300MB_s"] = time.perf_counter() - t0
os.system("nproc; lscpu | grep -i numa; nvidia-smi topo -m | head -5")
print(json.dumps(res, indent=1))
