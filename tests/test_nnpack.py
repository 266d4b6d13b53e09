"""Large 3x3 convolutions in inference through NNPACK: where they apply, as accurate as oneDNN's direct sum."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

from models import build_model
from models.cpu import nnpack
from models.gconv import conv2d
from tests.equivariance_helpers import assert_equivariant

needs_nnpack = pytest.mark.skipif(not torch._nnpack_available(), reason="this PyTorch build has no NNPACK")


def relative_to_terms(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, padding: int) -> float:
    """Largest error against float64, each output divided by the sum of its terms' magnitudes."""
    exact = F.conv2d(x.double(), w.double(), padding=padding)
    scale = F.conv2d(x.double().abs(), w.double().abs(), padding=padding)
    return ((got.double() - exact).abs() / scale).max().item()


@needs_nnpack
@pytest.mark.parametrize("shape, padding", [((2, 64, 82, 82), 0), ((3, 72, 94, 94), 0), ((2, 72, 80, 80), 1),
                                             ((2, 96, 81, 120), 1)])
def test_fft_convolution_is_as_accurate_as_the_direct_sum(shape, padding):
    torch.manual_seed(0)
    x = torch.relu(torch.randn(shape))  # post-ReLU, as the layers see it
    w = torch.randn(72, shape[1], 3, 3) / (3 * shape[1])
    with torch.inference_mode():
        assert nnpack.applies(x, w, 1, padding, 1)
        ours, direct = conv2d(x, w, padding=padding), F.conv2d(x, w, padding=padding)
    # Direct: about 1e-7. NNPACK's Winograd tiles, which the conditions exclude, give 5e-6.
    assert relative_to_terms(direct, x, w, padding) < 5e-7
    assert relative_to_terms(ours, x, w, padding) < 5e-7


@pytest.mark.parametrize("change", ["gradient", "one image", "63 channels", "output side 79", "float64",
                                    "dilation 2", "stride 2", "5x5 filter", "switched off"])
def test_nnpack_only_where_it_is_as_accurate_and_faster(change, monkeypatch):
    x, w = torch.rand(2, 64, 96, 96), torch.rand(8, 64, 3, 3)
    stride, padding, dilation = 1, 0, 1
    with torch.no_grad():
        assert nnpack.applies(x, w.requires_grad_(), stride, padding, dilation) == torch._nnpack_available()
    if change == "gradient":
        w.requires_grad_()
    elif change == "one image":
        x = x[:1]
    elif change == "63 channels":
        x, w = x[:, :63], w[:, :63]
    elif change == "output side 79":
        x = x[..., :81]
    elif change == "float64":
        x, w = x.double(), w.double()
    elif change == "dilation 2":
        dilation = 2
    elif change == "stride 2":
        stride = 2
    elif change == "5x5 filter":
        w = torch.rand(8, 64, 5, 5)
    else:
        monkeypatch.setenv("AAGC_NNPACK", "0")
    assert not nnpack.applies(x, w, stride, padding, dilation)


@needs_nnpack
def test_pcam_densenet_logits_and_equivariance_with_nnpack(monkeypatch):
    torch.manual_seed(0)
    model = build_model("fa_p4m_densenet").eval()
    x = torch.randn(2, 3, 96, 96)
    used = []
    monkeypatch.setattr(nnpack, "conv3x3", lambda *args, convolve=nnpack.conv3x3: used.append(1) or convolve(*args))
    with torch.inference_mode():
        ours = model(x)
        assert used, "the first dense layer did not run through NNPACK"
        monkeypatch.setenv("AAGC_NNPACK", "0")
        direct = model(x)
        monkeypatch.delenv("AAGC_NNPACK")
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
    scale = exact.abs().max()
    assert ((ours - exact).abs().max() / scale).item() < 1e-5
    assert ((ours - direct).abs().max() / scale).item() < 1e-5
    assert_equivariant(model, x, model.group, out_axes=(), out_transforms=False, what="fa_p4m_densenet (NNPACK)")


@needs_nnpack
def test_concurrent_calls_give_the_serial_results():
    # The app serves sessions from several threads; NNPACK's workspace and thread pool must not be shared unsafely.
    torch.manual_seed(0)
    inputs = [torch.randn(2, 64, 82 + 2 * i, 82) for i in range(4)]
    w = torch.randn(16, 64, 3, 3)
    with torch.inference_mode():
        serial = [nnpack.conv3x3(x, w, 0) for x in inputs]
        results = [None] * len(inputs)

        def run(i):
            for _ in range(3):
                results[i] = nnpack.conv3x3(inputs[i], w, 0)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(torch.equal(a, b) for a, b in zip(serial, results, strict=True))
