"""Where a slide's chunks run: each Dask worker's device, and the cluster in a sentence.

A worker that sees CUDA evaluates its chunks on its GPU, one that does not on its CPU; both kinds work side by side
on one cluster, each taking chunks as it frees up (Dask's own scheduling). The choice is the worker's own, made in
the worker process (:func:`worker_device`), so a task names no device and any worker can take any chunk.

Precision: float32 on both. On a GPU, TensorFloat-32 is switched off for convolutions and matrix products
(:func:`prepare_device`; PyTorch allows it for cuDNN convolutions by default, which would round the inputs of
every product to 10 bits of mantissa), so a GPU's probabilities differ from the CPU's by float32 round-off in a
different order of sums, not by a lower precision.
"""

from __future__ import annotations

import torch

__all__ = ["worker_device", "prepare_device", "describe_cluster", "cluster_devices"]


def worker_device() -> torch.device:
    """This process's device for chunks: its first CUDA device where PyTorch sees one, else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def prepare_device(device: torch.device) -> None:
    """Full float32 products on ``device``: TensorFloat-32 off where it is a GPU (see the module's docstring)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def cluster_devices(client) -> dict[str, str]:
    """Each worker's device type (``"cuda"`` or ``"cpu"``) by its address, asked of the workers themselves."""
    return client.run(lambda: worker_device().type)


def describe_cluster(devices: dict[str, str], address: str | None = None) -> str:
    """``"3 workers, 2 with a GPU"`` (and where, when ``address`` names a scheduler): what a page says of where its
    analyses run."""
    count, gpus = len(devices), sum(kind == "cuda" for kind in devices.values())
    words = f"{count} worker{'s' if count != 1 else ''}, {gpus or 'none'} with a GPU"
    return words + (f", on the Dask scheduler at {address}" if address else ", on a local Dask cluster")
