"""The precision a slide's chunks run in, decided once for the whole analysis by the CPUs that run them.

A plan records the precision decided (:attr:`app.slides.run.SlidePlan.precision`), its store is named by it
(:func:`app.slides.store.store_key`) and every task of the plan names it, so that one store never holds results of
two precisions. ``float32`` and ``bfloat16`` asked are sent as they are. ``auto`` is decided by the CPU of each Dask
worker (:func:`worker_precision`, :func:`models.precision.choose_precision` there): where they all choose one
precision the plan takes it; where they differ it takes float32, which every CPU computes, and exactly. Without a
client to ask (a local cluster's workers share this machine's CPU and environment), this process decides.

A worker that computes on its GPU chooses float32 for ``auto``: the bfloat16 path is the CPU's (oneDNN's bfloat16
convolutions and the kernels of :mod:`models.cpu.bfloat16_kernels`).
"""

from __future__ import annotations

from torch import nn

from models.precision import Precision, bfloat16_covers, choose_precision

from .workers import worker_device

__all__ = ["resolve_precision", "worker_precision", "agreed_precision", "FLOAT32"]

FLOAT32 = choose_precision("float32")


def _here(requested: str, model: nn.Module | None = None) -> Precision:
    """:func:`models.precision.choose_precision` for the chunks this machine's workers run: float32 for ``auto``
    where they run on a GPU."""
    chosen = choose_precision(requested, model)
    if requested == "auto" and chosen.name == "bfloat16" and worker_device().type == "cuda":
        return Precision("float32", "auto: the chunks run on this machine's GPU, and the bfloat16 path is the CPU's: "
                                    "float32, the exact path")
    return chosen


def worker_precision(requested: str = "auto") -> str:
    """On a Dask worker: the precision it would run ``requested`` in, by its own CPU (and device)."""
    return _here(requested).name


def _workers(count: int) -> str:
    return "the one Dask worker" if count == 1 else f"all {count} Dask workers"


def agreed_precision(chosen: dict[str, str]) -> Precision:
    """The precision of an analysis whose workers chose ``chosen`` (worker address -> precision name) for ``auto``:
    theirs where they agree, else float32."""
    names, count = set(chosen.values()), len(chosen)
    if not chosen:
        return Precision("float32", "auto: no Dask worker has joined yet to be asked: float32, the exact path, which "
                                    "every CPU computes")
    if names == {"bfloat16"}:
        return Precision("bfloat16", f"auto: {_workers(count)} chose bfloat16 by their CPUs (AMX-BF16, where "
                                     "bfloat16 was measured several times faster than float32)")
    if names == {"float32"}:
        return Precision("float32", f"auto: {_workers(count)} chose float32 by their CPUs (no AMX-BF16, or a "
                                    "GPU): the exact path")
    mixed = sum(name == "bfloat16" for name in chosen.values())
    return Precision("float32", f"auto: the Dask workers' CPUs differ ({mixed} of {count} would choose bfloat16): "
                                "float32, which every CPU computes, and exactly, so that one analysis holds one "
                                "precision")


def resolve_precision(requested: str = "auto", model: nn.Module | None = None, client=None) -> Precision:
    """The precision an analysis by ``model`` runs in, for a request of :data:`models.precision.PRECISIONS`:
    ``auto`` asked of every worker of ``client`` (a ``dask.distributed.Client``; :func:`agreed_precision`), or of
    this machine without one; ``float32`` and ``bfloat16`` as asked (bfloat16 then runs even where it is emulated,
    and its reason says so). A network without a bfloat16 path gets float32 without asking anyone.

    Raises:
        ValueError: ``requested`` is not one of :data:`models.precision.PRECISIONS`.
    """
    here = _here(requested, model)
    if requested != "auto" or client is None or (model is not None and not bfloat16_covers(model)):
        return here
    return agreed_precision(client.run(worker_precision, requested))
