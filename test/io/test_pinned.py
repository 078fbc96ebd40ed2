"""Pinned host buffers by registration (earth2studio_compile.io.pinned): pinned,
copied into asynchronously and bitwise, unregistered once the last view is freed
(on the module's thread: the caller does not wait), freed only after; without
CUDA, a clear error."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from earth2studio_compile.io import pinned
from earth2studio_compile.io.pinned import pinned_empty, registered_bytes, settle


def _settled_bytes() -> int:
    """The count once an earlier test's garbage is freed: a failed test's buffers,
    collected in the middle of the next, moved it (GPU suite, 2026-11-30)."""
    gc.collect()
    settle()
    return registered_bytes()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_without_cuda_it_says_so():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        pinned_empty(4, torch.float32)


def test_the_caller_does_not_wait_for_unregistering(monkeypatch):
    """Dropping a buffer's last view queues its unregistering on the module's
    thread: 29 ms of a compiled FCN ensemble call's flush (H200) went to waiting
    for it. Its memory stays alive until it is unregistered."""
    calls: list[tuple[str, int, str]] = []
    go = threading.Event()

    def runtime(function: str, index: int, pointer: int, *args: int) -> None:
        if function == "cudaHostUnregister":
            go.wait(timeout=5)
        calls.append((function, pointer, threading.current_thread().name))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = _settled_bytes()
    monkeypatch.setattr(pinned, "_runtime", runtime)
    buffer = pinned_empty(1 << 20, torch.float32, torch.device("cuda", 0))
    buffer.fill_(3.0)
    pointer = buffer.data_ptr()
    assert registered_bytes() == before + (4 << 20)
    start = time.perf_counter()
    del buffer
    gc.collect()
    assert time.perf_counter() - start < 1.0  # not waiting for the unregistering
    assert registered_bytes() == before + (4 << 20)  # counted until it has run
    go.set()
    settle()
    assert registered_bytes() == before
    (register, unregister) = calls
    assert register[:2] == ("cudaHostRegister", pointer)
    assert unregister[:2] == ("cudaHostUnregister", pointer)
    assert register[2] == unregister[2] != threading.current_thread().name


@pytest.mark.gpu
def test_a_registered_buffer_takes_async_copies_and_is_unregistered_when_freed():
    before = _settled_bytes()
    x = torch.randn(1 << 22, device="cuda")
    buffer = pinned_empty(x.numel(), x.dtype, x.device)
    assert buffer.is_pinned() and buffer.dtype == x.dtype
    assert registered_bytes() == before + x.numel() * x.element_size()
    torch.cuda._sleep(10_000_000)  # finished late on the stream: the copy waits
    x.add_(1.0)
    expected = x.cpu()
    buffer.copy_(x, non_blocking=True)
    x.mul_(-1.0)  # ordered after the copy
    torch.cuda.synchronize()
    assert torch.equal(buffer.view(torch.int32), expected.view(torch.int32))
    view = buffer[10:]
    del buffer
    gc.collect()
    assert registered_bytes() > before  # a view still holds the memory
    del view
    gc.collect()
    settle()
    assert registered_bytes() == before


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_empty_and_other_types(dtype):
    assert pinned_empty(0, dtype).numel() == 0
    buffer = pinned_empty(1000, dtype, torch.device("cuda"))
    x = torch.arange(1000, device="cuda").to(dtype)
    buffer.copy_(x, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(buffer, x.cpu())
