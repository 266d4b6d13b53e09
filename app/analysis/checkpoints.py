"""Models for the app: the shipped checkpoints, and uploaded ones.

Shipped checkpoints are ``checkpoints/*.safetensors`` with their model cards
(:mod:`models.checkpoint`); listing them reads only the cards. Uploads are
either our format (a ``.safetensors`` file with its card embedded) or a
``.pth`` of the paper's code, its architecture found from its weights
(:func:`upload_architectures`) and imported by
:func:`models.import_reference_checkpoint`, which reads with
``torch.load(weights_only=True)`` and so refuses pickled objects other than
tensors. Every failure is a :class:`models.CheckpointError` whose message names
the uploaded file (never the temporary copy) and says what is wrong.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from models import CheckpointError, Network, import_reference_checkpoint, load_checkpoint
from models.arch_detection import detect_architecture
from models.card import validate_card
from models.checkpoint import CARD_KEY, card_path
from models.reference_import import read_state_dict, reference_card

__all__ = ["CheckpointEntry", "checkpoint_folder",
           "list_checkpoints", "load_listed", "load_uploaded_checkpoint", "MAX_CHECKPOINT_BYTES",
           "CheckpointError", "by_dataset", "DATASET_TITLES", "error_text", "upload_architectures"]

MAX_CHECKPOINT_BYTES = 200 * 2**20


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint file as the model picker lists it.

    Attributes:
        name: the file's stem, e.g. ``"fa_p4cnn_rot_mnist"``.
        path: the ``.safetensors`` file.
        arch, dataset, group: from its card (group None for planar models).
        test_error: ``card["metrics"]["test_error"]``, None if absent.
        card: the whole card; empty when it could not be read.
        error: why the card could not be read; empty for a usable entry.
    """

    name: str
    path: Path
    arch: str = ""
    dataset: str = ""
    group: str | None = None
    test_error: float | None = None
    card: dict | None = None
    error: str = ""

    @property
    def dataset_title(self) -> str:
        """What the picker calls the entry's dataset, e.g. ``"rot-MNIST"``."""
        if self.error:
            return "unreadable"
        return DATASET_TITLES.get(self.dataset, self.dataset or "unknown dataset")

    @property
    def label(self) -> str:
        """e.g. ``"fa_p4cnn_rot_mnist: fa_p4cnn, rot-MNIST, p4, test error 1.6 %"``."""
        if self.error:
            return f"{self.name}: unreadable ({self.error})"
        err = error_text(self.card or {})
        return f"{self.name}: {self.arch}, {self.dataset or 'unknown dataset'}, {self.group or 'planar'}, {err}"


def error_text(card: dict) -> str:
    """The card's test error as a reader should take it: ours (``test_error``, measured by this project) or the
    paper's log (``paper_logged_test_error``, for rot-MNIST selected on the test set), e.g. ``"test error 2.10 %"``.
    """
    metrics = card.get("metrics") or {}
    if metrics.get("test_error") is not None:
        return f"test error {100 * metrics['test_error']:.2f} %"
    logged = metrics.get("paper_logged_test_error")
    if logged is None:
        return "no test error"
    dataset = card.get("dataset") or {}
    selected = " (selected on the test set)" if dataset.get("name") == "rot_mnist" else ""
    return f"the paper's log: test error {100 * logged:.2f} %{selected}"


# The picker's names of the datasets checkpoints are trained on; others show their card's name.
DATASET_TITLES = {"rot_mnist": "rot-MNIST", "pcam_public": "PCam (H&E)", "pcam": "PCam (H&E)",
                  "pcam_subset": "PCam subset (H&E)", "he_demo": "H&E proxy", "cifar10": "CIFAR-10"}


def by_dataset(entries: list[CheckpointEntry],
               first: CheckpointEntry | None = None) -> dict[str, list[CheckpointEntry]]:
    """The entries grouped by :attr:`~CheckpointEntry.dataset_title`: ``first``'s group first, the others by title,
    unreadable files last; entries keep their order within a group."""
    groups: dict[str, list[CheckpointEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.dataset_title, []).append(entry)
    lead = first.dataset_title if first is not None else None
    order = sorted(groups, key=lambda title: (title != lead, title == "unreadable", title))
    return {title: groups[title] for title in order}


def checkpoint_folder() -> Path:
    """The folder the app lists checkpoints from: ``$APP_CHECKPOINTS``, or ``checkpoints``."""
    return Path(os.environ.get("APP_CHECKPOINTS", "checkpoints"))


def list_checkpoints(folder: str | Path = "checkpoints") -> list[CheckpointEntry]:
    """Every ``*.safetensors`` in ``folder``, sorted by name; a missing or empty folder gives ``[]``.

    Files whose card cannot be read are listed with ``error`` set, so the UI can
    say so instead of failing.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return [_entry(path) for path in sorted(folder.glob("*.safetensors"))]


def _entry(path: Path) -> CheckpointEntry:
    try:
        card = read_card(path)
        validate_card(card, "its model card")  # the fields the picker and the pages read have their types
    except CheckpointError as err:
        return CheckpointEntry(path.stem, path, error=str(err))
    test_error = card["metrics"].get("test_error")
    return CheckpointEntry(
        name=path.stem, path=path, arch=card["arch"], dataset=card["dataset"]["name"], group=card["group"],
        test_error=None if test_error is None else float(test_error), card=card,
    )


def read_card(path: Path) -> dict:
    """The model card of a checkpoint, from the JSON beside it or its embedded metadata, without loading weights."""
    side = card_path(path)
    try:
        if side.is_file():
            text = side.read_text()
        else:
            with safe_open(str(path), framework="pt") as handle:
                text = (handle.metadata() or {}).get(CARD_KEY)
        if text is None:
            raise CheckpointError("no model card")
        card = json.loads(text)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors, OS and JSON errors alike make the entry unusable
        raise CheckpointError(f"cannot read its model card: {err}") from None
    if not isinstance(card, dict):
        raise CheckpointError("its model card is not a JSON object")
    return card


def load_listed(entry: CheckpointEntry) -> tuple[Network, dict]:
    """The model (eval mode) and card of a listed checkpoint."""
    return load_checkpoint(entry.path)


def _saved(data: bytes, filename: str, folder: str) -> Path:
    """The upload written to a temporary folder, after the checks every upload passes."""
    suffix = Path(filename).suffix.lower()
    if not data:
        raise CheckpointError(f"{filename} is empty (0 bytes)")
    if suffix not in (".safetensors", ".pth", ".pt"):
        raise CheckpointError(
            f"{filename}: upload a .safetensors checkpoint (with its model card) or a .pth of the paper's code"
        )
    path = Path(folder) / f"upload{suffix}"
    try:
        path.write_bytes(data)
    except OSError as err:  # a full disk, say: the visitor is told, the server goes on
        raise CheckpointError(f"{filename} cannot be stored on the server now ({err.strerror or err})") from None
    return path


def _named(err: Exception, path: Path, filename: str) -> CheckpointError:
    """The error with the temporary copy's path replaced by the uploaded file's name."""
    message = str(err).replace(str(path), filename)
    return CheckpointError(message if filename in message else f"{filename}: {message}")


def _unexpected(err: BaseException, path: Path, filename: str) -> CheckpointError:
    """An error no check foresaw, as a sentence naming the uploaded file and the error's first line."""
    text = str(err).strip().replace(str(path), filename)
    first = text.splitlines()[0][:200] if text else "no message"
    return CheckpointError(f"{filename} cannot be loaded ({type(err).__name__}: {first})")


def upload_architectures(data: bytes, filename: str, max_bytes: int = MAX_CHECKPOINT_BYTES) -> list[str]:
    """The registered architectures an uploaded ``.pth`` fits, from its tensors' names and shapes: normally one.

    Raises:
        CheckpointError: unreadable, too large, or fitting no architecture (the message names the nearest).
    """
    if len(data) > max_bytes:
        raise CheckpointError(f"{filename} has {len(data) / 2**20:.0f} MB; the limit is {max_bytes / 2**20:.0f} MB")
    with tempfile.TemporaryDirectory(prefix="upload-") as folder:
        path = _saved(data, filename, folder)
        try:
            return detect_architecture(read_state_dict(path), filename)
        except CheckpointError as err:
            raise _named(err, path, filename) from None
        except Exception as err:  # an uploaded file: whatever reading it raises is said as a sentence
            raise _unexpected(err, path, filename) from None


def load_uploaded_checkpoint(
    data: bytes, filename: str, arch: str | None = None, max_bytes: int = MAX_CHECKPOINT_BYTES
) -> tuple[Network, dict]:
    """A model from uploaded bytes: ours (``.safetensors``) or the paper's (``.pth``).

    Args:
        data: the file's bytes.
        filename: its name as uploaded; the suffix picks the format, and messages name it.
        arch: for ``.pth`` files: our registry name or the paper code's model name
            (e.g. ``"f_att_p4cnn"``); None: the architecture its weights fit.
        max_bytes: largest accepted file.

    Returns:
        ``(model in eval mode, card)``.

    Raises:
        CheckpointError: the message says what is wrong, naming ``filename``.
    """
    if len(data) > max_bytes:
        raise CheckpointError(f"{filename} has {len(data) / 2**20:.0f} MB; the limit is {max_bytes / 2**20:.0f} MB")
    with tempfile.TemporaryDirectory(prefix="upload-") as folder:
        path = _saved(data, filename, folder)
        try:
            if path.suffix == ".safetensors":
                return load_checkpoint(path)
            model = import_reference_checkpoint(path, arch)
        except (CheckpointError, ValueError) as err:
            # Unknown architectures and datasets without released checkpoints come as ValueError.
            raise _named(err, path, filename) from None
        except Exception as err:  # RuntimeError, MemoryError, ...: the page says it in a sentence, never a traceback
            raise _unexpected(err, path, filename) from None
    model.card = reference_card(model.arch, source=f"uploaded as {filename}")  # not the temporary folder's name
    return model, model.card
