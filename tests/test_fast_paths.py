"""The faster paths of plain operations equal the operations they replace."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO

from models.attention.statistics import maximum
from models.cpu.allocator import freed_memory_environ, retain_freed_memory
from models.gconv import conv2d
from models.pooling import spatial_avg_pool


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(1, 1, 0, 1), (1, 2, 0, 1), (3, 1, 1, 1), (3, 1, 2, 2)])
def test_conv2d_equals_torch_values_and_gradients(kernel, stride, padding, dilation):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 11, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 5, kernel, kernel, dtype=torch.float64, requires_grad=True)
    ours = conv2d(x, w, stride, padding, dilation)
    theirs = F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(theirs)
    grads = torch.autograd.grad(ours, (x, w), upstream)
    expected = torch.autograd.grad(theirs, (x, w), upstream)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_dilated_conv2d_runs_channels_last_and_returns_contiguous_values_and_gradients_of_torch():
    # float32 dilated convolutions take oneDNN's channels-last kernels (4x faster on AVX2); same function.
    torch.manual_seed(0)
    x = torch.randn(2, 16, 23, 21, requires_grad=True)
    w = torch.randn(8, 16, 7, 7, requires_grad=True)
    ours = conv2d(x, w, padding=12, dilation=4)
    assert ours.is_contiguous()  # NCHW, as the callers' views expect
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    theirs = F.conv2d(x64, w64, padding=12, dilation=4)
    torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-5)
    upstream = torch.randn_like(ours)
    grads = torch.autograd.grad(ours, (x, w), upstream)
    expected = torch.autograd.grad(theirs, (x64, w64), upstream.double())
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "shape, window", [((2, 3, 8, 12), 2), ((2, 3, 4, 8, 8), 2), ((1, 2, 4, 9, 9), 3), ((1, 2, 10, 10), 5)]
)
def test_tiled_average_pooling_equals_avg_pool2d(shape, window):
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    planar = x.reshape(-1, 1, *shape[-2:])
    expected = F.avg_pool2d(planar, window).view(*shape[:-2], shape[-2] // window, shape[-1] // window)
    with torch.no_grad():  # the tiled sums
        torch.testing.assert_close(spatial_avg_pool(x, window), expected, rtol=1e-13, atol=1e-13)
    ours = spatial_avg_pool(x, window)  # with a gradient: F.avg_pool2d
    torch.testing.assert_close(ours, expected, rtol=1e-13, atol=1e-13)
    upstream = torch.randn_like(expected)
    torch.testing.assert_close(torch.autograd.grad(ours, x, upstream)[0],
                               torch.autograd.grad(expected, x, upstream)[0], rtol=1e-13, atol=1e-13)


def test_pooling_that_does_not_tile_the_plane_falls_back_to_avg_pool2d():
    x = torch.randn(1, 2, 4, 7, 7)
    expected = F.avg_pool2d(x.view(1, 8, 7, 7), 2).view(1, 2, 4, 3, 3)
    torch.testing.assert_close(spatial_avg_pool(x, 2), expected, rtol=0, atol=0)


def test_maximum_has_the_values_of_amax_and_the_gradient_of_max_with_ties():
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], requires_grad=True)
    with torch.no_grad():
        assert torch.equal(maximum(x, dim=1), torch.tensor([3.0, 2.0]))
    (grad,) = torch.autograd.grad(maximum(x, dim=1).sum(), x)
    (expected,) = torch.autograd.grad(x.max(dim=1).values.sum(), x)
    assert torch.equal(grad, expected)
    assert grad.sum().item() == 2.0  # one maximum per row receives the gradient, not a share per tie


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc")
def test_retain_freed_memory_is_accepted_by_glibc_and_idempotent():
    assert retain_freed_memory() is True
    assert retain_freed_memory() is True
    # Allocation still works after it, for blocks above glibc's largest mmap threshold too.
    assert torch.ones(64 * 2**20, dtype=torch.uint8).sum().item() == 64 * 2**20


def test_keeping_freed_memory_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("AAGC_KEEP_FREED_MEMORY", "0")
    assert retain_freed_memory() is False


def test_the_environment_for_worker_processes_says_what_retain_freed_memory_does_with_one_arena(monkeypatch):
    monkeypatch.delenv("AAGC_KEEP_FREED_MEMORY", raising=False)
    assert freed_memory_environ() == {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
                                      "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
    monkeypatch.setenv("AAGC_KEEP_FREED_MEMORY", "0")
    assert freed_memory_environ() == {}


def test_released_memory_leaves_the_process():
    """In a child process that keeps freed memory: 400 MB allocated, written and freed stay in its RSS, and
    release_freed_memory gives them back (RSS falls by more than 300 MB)."""
    script = (
        "import ctypes, resource, sys\n"
        "from models.cpu.allocator import release_freed_memory, retain_freed_memory\n"
        "assert retain_freed_memory()\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()\n"
        "blocks = [ctypes.create_string_buffer(4_000_000) for _ in range(100)]\n"
        "del blocks\n"
        "kept = rss()\n"
        "assert release_freed_memory()\n"
        "print(kept - rss())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert int(out.stdout) > 300_000_000, out.stdout
