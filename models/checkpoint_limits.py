"""What a checkpoint may describe, checked before anything is built or read: a server loads files its visitors upload.

A model card's ``config`` says how large a network to build, and a file of a few kilobytes can ask for any size:
``channels=20000`` asks for 72 billion parameters. So a checkpoint is judged in this order, each step bounded:

1. :func:`check_config`: every config field within :data:`CONFIG_LIMITS` and the input within
   :data:`MAX_INPUT_SIZE` / :data:`MAX_INPUT_CHANNELS`, before the registry builds anything.
2. :func:`planned_state`: the network built on PyTorch's ``meta`` device, which allocates nothing, its random
   initialisation skipped (a few milliseconds): its exact tensor names, shapes and dtypes, and so its parameter
   count and bytes, held to :data:`MAX_PARAMETERS` and :data:`MAX_MODEL_BYTES`.
3. :func:`read_safetensors_header`: the weights file's own tensor table, read from its header alone (8 bytes of
   length, then JSON), its offsets checked to tile the file exactly; :func:`check_header_fits` then holds it to the
   planned tensors. Only then are the weights read and the model built.

A ``.pth`` saved by ``torch.save`` is a zip archive; :func:`check_pth_archive` holds its members' declared sizes to
:data:`MAX_PTH_BYTES` and their inflation to :data:`MAX_INFLATION` before ``torch.load`` inflates anything.
Every refusal is a :class:`~models.card.CheckpointError` whose message says what the limit is and why.
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from pathlib import Path

import torch

from .arch_detection import differences
from .card import CheckpointError
from .registry import build_model, model_info

__all__ = ["CONFIG_LIMITS", "MAX_INPUT_SIZE", "MAX_INPUT_CHANNELS", "MAX_PARAMETERS", "MAX_MODEL_BYTES",
           "MAX_HEADER_BYTES", "MAX_PTH_BYTES", "MAX_INFLATION", "check_config", "planned_state",
           "read_safetensors_header", "check_header_fits", "check_pth_archive"]

# Inclusive (low, high) per config field of the registry's architectures. The highs are about 10x the widest and
# deepest network shipped or in the papers (channels: planar All-CNN-C 96, the shipped z2cnn 20; widths: planar
# ResNet-44's 128; blocks: ResNet-44's 7 per stage, DenseNet's 5), so every real model fits, and far below what
# exhausts a server: the parameter and byte bounds below are what finally bound memory; these refuse nonsense early
# with a sentence naming the field.
CONFIG_LIMITS: dict[str, tuple[float, float]] = {
    "channels": (1, 1024),
    "widths": (1, 1024),
    "blocks": (1, 64),
    "in_channels": (1, 16),
    "num_classes": (1, 10_000),
    "attention_reduction": (1, 4096),
    "attention_kernel": (1, 31),
    "input_attention_dilation": (1, 16),
    "dropout": (0.0, 1.0),
    "input_dropout": (0.0, 1.0),
}
# The card's input: the side of the image the app makes and the model takes (shipped: 28 and 96 px).
MAX_INPUT_SIZE = 512
MAX_INPUT_CHANNELS = 16
# 50 M parameters: 200 MB of float32, the app's upload limit (MAX_CHECKPOINT_BYTES), so no file the app takes can
# hold more; the largest shipped or paper model has 3.6 M (a_p4_allcnnc).
MAX_PARAMETERS = 50_000_000
MAX_MODEL_BYTES = 256 * 2**20  # parameters and buffers of the built model
# The header is JSON holding the tensor table and the embedded model card (shipped: 7-200 KB).
MAX_HEADER_BYTES = 16 * 2**20
# A .pth's members as inflated by torch.load: the upload limit again. torch.save stores members uncompressed
# (inflation 1); a member may inflate at most MAX_INFLATION times (deflated float weights: about 1.1), so a
# re-zipped file of zeros, 0.5 MB on disk for 512 MiB inflated, is refused.
MAX_PTH_BYTES = 200 * 2**20
MAX_INFLATION = 4.0
_SMALL_MEMBER = 2**16  # members this small (the pickle, "version") may compress well: their inflation is harmless

# safetensors' dtype names and their sizes in bytes.
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_TORCH_DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
                 torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.int64: "I64",
                 torch.float64: "F64"}


def check_config(card: dict, where: str) -> None:
    """Refuse a card whose ``config`` or ``input`` is outside the stated limits, before anything is built.

    Args:
        card: a card that passed :func:`models.card.validate_card`.
        where: how messages name it (the file).

    Raises:
        CheckpointError: an unknown architecture, or the first field out of bounds, with its bound.
    """
    try:
        model_info(card["arch"])
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    for field, value in card["config"].items():
        if field not in CONFIG_LIMITS:
            continue  # group, attention: names, which the registry checks
        low, high = CONFIG_LIMITS[field]
        for number in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise CheckpointError(f"{where}: config field {field!r} must be a number (got {str(number)[:40]})")
            if not low <= number <= high:
                raise CheckpointError(f"{where}: config field {field!r} is {number}, outside {low}..{high}, the "
                                      f"limit of what this server builds (its largest real model is far smaller)")
    size, channels = card["input"]["size"], card["input"]["channels"]
    if size > MAX_INPUT_SIZE or channels > MAX_INPUT_CHANNELS:
        raise CheckpointError(f"{where}: its input of {channels} x {size} x {size} pixels is beyond this server's "
                              f"limit of {MAX_INPUT_CHANNELS} channels of {MAX_INPUT_SIZE} x {MAX_INPUT_SIZE}")


def planned_state(card: dict, where: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors the card's network holds, ``name -> (safetensors dtype, shape)``, from a build on the ``meta``
    device (nothing allocated), held to :data:`MAX_PARAMETERS` and :data:`MAX_MODEL_BYTES`.

    Raises:
        CheckpointError: a config the architecture refuses, or a network beyond the bounds.
    """
    try:
        with torch.device("meta"), _NoRandomInit():
            model = build_model(card["arch"], **card["config"])
    except Exception as err:  # an untrusted config: whatever the builder raises means it cannot be built
        raise CheckpointError(f"{where}: cannot build its architecture ({_first_line(err)})") from None
    parameters = sum(p.numel() for p in model.parameters())
    state = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    if parameters > MAX_PARAMETERS or nbytes > MAX_MODEL_BYTES:
        raise CheckpointError(f"{where}: its config describes {card['arch']} with {parameters:,} parameters "
                              f"({nbytes / 2**20:,.0f} MB); this server builds at most {MAX_PARAMETERS:,} "
                              f"({MAX_MODEL_BYTES / 2**20:.0f} MB)")
    return {name: (_TORCH_DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape)) for name, t in state.items()}


class _NoRandomInit(torch.overrides.TorchFunctionMode):
    """Random initialisation skipped: on the meta device it means nothing, and PyTorch runs it through its Python
    references there, whose first use imports its compiler (8-17 s on these cores for one planar All-CNN-C)."""

    _SKIPPED = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_,
                          torch.Tensor.exponential_, torch.Tensor.log_normal_, torch.Tensor.cauchy_,
                          torch.Tensor.geometric_, torch.Tensor.random_, torch.Tensor.erfinv_,
                          torch.nn.init.normal_, torch.nn.init.uniform_, torch.nn.init.trunc_normal_,
                          torch.nn.init.kaiming_normal_, torch.nn.init.kaiming_uniform_,
                          torch.nn.init.xavier_normal_, torch.nn.init.xavier_uniform_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self._SKIPPED:  # each fills its first argument in place and returns it
            return args[0] if args else (kwargs or {}).get("tensor")
        return func(*args, **(kwargs or {}))


def read_safetensors_header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict]:
    """A safetensors file's tensor table and metadata from its header alone, checked to describe the file exactly.

    The header is an 8-byte little-endian length and that many bytes of JSON: per tensor its ``dtype``, ``shape``
    and ``data_offsets`` into the data that follows. Each tensor's offsets must span its dtype and shape's bytes,
    and the tensors must tile the data from 0 to the file's end with nothing left over.

    Returns:
        ``({name: (dtype, shape)}, metadata)``.

    Raises:
        CheckpointError: a header that is too long, not JSON, or disagrees with the file's size.
    """
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is not a readable safetensors file (only {size} bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path} is not a readable safetensors file (its header claims {length:,} bytes; "
                                  f"the file has {size:,} and the limit is {MAX_HEADER_BYTES // 2**20} MB)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{path} is not a readable safetensors file (header not JSON: {err})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path} is not a readable safetensors file (its metadata is not a JSON object)")
    tensors, spans = {}, []
    for name, entry in header.items():
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not all(isinstance(n, int) and n >= 0 for n in (*shape, start, end)):
                raise ValueError("negative or not whole numbers")
            width = _DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: its header's entry for tensor {name[:80]!r} is malformed ({err})") from None
        if end - start != math.prod(shape) * width:
            raise CheckpointError(f"{path}: its header gives tensor {name[:80]!r} ({dtype} {shape}) {end - start:,} "
                                  f"bytes, not the {math.prod(shape) * width:,} its shape needs")
        tensors[name] = (dtype, tuple(shape))
        spans.append((start, end))
    data = size - 8 - length
    covered = 0
    for start, end in sorted(spans):
        if start != covered:
            break
        covered = end
    if covered != data:
        raise CheckpointError(f"{path}: its header's tensors take {sum(e - s for s, e in spans):,} bytes, but the file "
                              f"holds {data:,} bytes of data after the header: truncated or altered")
    return tensors, metadata


def check_header_fits(found: dict[str, tuple[str, tuple[int, ...]]], planned: dict[str, tuple[str, tuple[int, ...]]],
                      where: str, arch: str) -> None:
    """Refuse a file whose tensors (names, shapes, dtypes) are not those of the network its card describes.

    Raises:
        CheckpointError: naming the missing, unexpected and misshapen tensors.
    """
    wrong = differences({k: v[1] for k, v in planned.items()}, {k: v[1] for k, v in found.items()})
    if wrong:
        raise CheckpointError(f"{where} does not fit {arch}: {wrong} (the network its card describes)")
    # Any float width loads into a float parameter (a float64 or float16 save of a float32 network); not an integer
    # for a float, nor the other way round.
    dtypes = sorted(f"{k} {found[k][0]} != {planned[k][0]}" for k in planned
                    if _is_float(found[k][0]) != _is_float(planned[k][0]))
    if dtypes:
        raise CheckpointError(f"{where} does not fit {arch}: wrong dtypes {dtypes[:5]}")


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("F", "BF"))


def check_pth_archive(path: Path) -> None:
    """Refuse a ``torch.save`` zip whose members would inflate beyond :data:`MAX_PTH_BYTES` in all, or any member
    of over 64 KiB beyond :data:`MAX_INFLATION` times its stored size, from the zip's directory alone.
    A file that is not a zip (the legacy format of the paper's releases) is left to ``torch.load``: its tensors are
    stored uncompressed, and a storage its pickle declares larger than the file holds is allocated untouched and
    refused by ``torch.load``'s own size check (measured: a 4 KB file declaring 8 GiB, refused in 0.02 s with the
    process's peak unchanged at 221 MB; ``tests/test_checkpoint_limits.py``).

    Raises:
        CheckpointError: the member and its sizes, or a damaged archive.
    """
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is a damaged zip archive ({err})") from None
    total = sum(member.file_size for member in members)
    if total > MAX_PTH_BYTES:
        raise CheckpointError(f"{path} would inflate to {total / 2**20:,.0f} MB when loaded; the limit is "
                              f"{MAX_PTH_BYTES / 2**20:.0f} MB")
    for member in members:
        if member.file_size > _SMALL_MEMBER and member.file_size > MAX_INFLATION * member.compress_size:
            raise CheckpointError(f"{path}: its member {member.filename[-60:]!r} inflates {member.compress_size:,} "
                                  f"bytes to {member.file_size:,} (over {MAX_INFLATION:g} times): a compressed "
                                  "archive, which torch.save never writes, is refused")


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
