"""Architectures by name: ``list_models()``, ``build_model(name, **overrides)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .network import Network

__all__ = ["register_model", "list_models", "build_model", "model_info", "ModelInfo"]


@dataclass(frozen=True)
class ModelInfo:
    """A registered architecture.

    Attributes:
        name: registry name.
        builder: the Network class, called with a config.
        config: its default config (a frozen dataclass).
        dataset: the dataset family it was designed for (``rot_mnist``, ``cifar10``, ``pcam``).
        input_size: expected input side in pixels.
        description: one line for humans.
    """

    name: str
    builder: Callable[..., Network]
    config: object
    dataset: str
    input_size: int
    description: str


_REGISTRY: dict[str, ModelInfo] = {}


def register_model(name, builder, config, *, dataset, input_size, description) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelInfo(name, builder, config, dataset, input_size, description)


def list_models() -> list[str]:
    """Names of every registered architecture, sorted."""
    return sorted(_REGISTRY)


def model_info(name: str) -> ModelInfo:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(list_models())}") from None


def build_model(name: str, **overrides) -> Network:
    """A freshly initialised network.

    Args:
        name: one of :func:`list_models`.
        **overrides: fields of its config to change, e.g. ``dropout=0.0``.

    Raises:
        ValueError: unknown name or config field.
    """
    info = model_info(name)
    fields = {f.name for f in dataclasses.fields(info.config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"{name} has no config field(s) {unknown}; its fields are {sorted(fields)}")
    model = info.builder(dataclasses.replace(info.config, **overrides))
    model.arch = name
    return model
