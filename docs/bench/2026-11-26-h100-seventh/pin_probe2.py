import time, json, os, torch, ctypes
from concurrent.futures import ThreadPoolExecutor
n = 108_000_000
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
cudart = torch.cuda.cudart()
out = {}
a = torch.randn(2048, 2048, device="cuda")
def launches(k=200):
    s = time.perf_counter()
    for _ in range(k): a @ a
    torch.cuda.synchronize(); return time.perf_counter() - s
out["launch_alone"] = launches()
ex = ThreadPoolExecutor(1)
def register(m):
    s = time.perf_counter(); t = torch.empty(m); t.view(-1)[::1024].zero_(); touch = time.perf_counter() - s
    r = cudart.cudaHostRegister(t.data_ptr(), t.numel() * 4, 0); reg = time.perf_counter() - s - touch
    torch.cuda.cudart().cudaGetLastError() if hasattr(torch.cuda.cudart(),'cudaGetLastError') else None
    print('register', m, r, flush=True)
    return t, touch, reg, int(r)
t1, touch, reg, rc = register(n)
out["register_main"] = dict(touch=touch, reg=reg, rc=rc, is_pinned=t1.is_pinned())
# async copy into registered memory works?
dev = torch.randn(n, device="cuda"); torch.cuda.synchronize()
s = time.perf_counter(); t1.copy_(dev, non_blocking=True); q = time.perf_counter() - s; torch.cuda.synchronize()
out["copy_into_registered"] = dict(queue=q, total=time.perf_counter() - s, equal=bool(torch.equal(t1, dev.cpu())))
# register on background thread beside launches
s = time.perf_counter(); fut = ex.submit(register, n + 7)
out["launch_beside_register"] = launches(); r = fut.result(); out["bg_register"] = dict(touch=r[1], reg=r[2], rc=r[3], total=time.perf_counter() - s); print(out, flush=True)
# pinned alloc on background beside launches (fresh size bin)
fut = ex.submit(lambda: (time.perf_counter(), torch.empty(200_000_000, pin_memory=True), time.perf_counter()))
out["launch_beside_hostalloc"] = launches(); r = fut.result(); out["bg_hostalloc"] = r[2] - r[0]
# pageable D2H on a background thread beside launches
dev2 = dev.clone(); page = torch.empty(n)
s = time.perf_counter(); page.copy_(dev2); out["pageable_copy_main"] = time.perf_counter() - s
fut = ex.submit(lambda: (time.perf_counter(), page.copy_(dev2), time.perf_counter()))
out["launch_beside_pageable"] = launches(); r = fut.result(); out["bg_pageable"] = r[2] - r[0]
# register a fresh malloc with no prefault
def register_nofault(m):
    t = torch.empty(m); s = time.perf_counter(); rc = cudart.cudaHostRegister(t.data_ptr(), t.numel() * 4, 0); return t, time.perf_counter() - s
out["register_nofault"] = register_nofault(n + 13)[1]
print(json.dumps(out, indent=1)); json.dump(out, open(os.environ["OUT"] + "/pin2.json", "w"))
