"""Does another thread's event.synchronize() during a CUDA-graph capture fail, per mode?"""
import threading

import torch

x = torch.randn(1024, 1024, device="cuda")
ev = torch.cuda.Event()
ev.record()
(x @ x).sum().item()
torch.cuda.synchronize()
for mode in ("global", "thread_local"):
    errors = []

    def wait():
        try:
            ev.synchronize()
        except Exception as e:
            errors.append(repr(e)[:160])

    g = torch.cuda.CUDAGraph()
    capture_error = None
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            y = x @ x
            t = threading.Thread(target=wait)
            t.start()
            t.join()
    except Exception as e:
        capture_error = repr(e)[:160]
    print(f"capture_mode_check {mode}: waiter errors {errors}, capture error {capture_error}", flush=True)
    torch.cuda.synchronize()
