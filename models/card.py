"""The model card: one schema for our checkpoints and the paper's imported ones, and the validator both pass.

Every card is checked by :func:`validate_card` where it enters the program (loading a checkpoint, listing one,
importing a release of the paper's code), so a reader finds each field absent or of the type below, never, say,
a string where the dataset's dict belongs.

Required fields:

* ``arch`` (str), ``config`` (dict): the registered architecture and its config;
* ``group``: ``"p4"``, ``"p4m"``, or null for a planar CNN;
* ``input``: ``size`` and ``channels`` (positive ints), ``mean`` and ``std`` (one number per channel, for
  pixels in [0, 1]; std positive) and ``transposed`` (bool: transpose the image before normalising);
* ``dataset``: a dict with ``name`` (str), optionally ``source`` and ``notes`` (str), ``class_names``
  (list of str), ``splits`` (dict) and ``test_files`` (list of str);
* ``class_names``: one str per class;
* ``metrics``: a dict of numbers or null (``test_error``, ``test_auc``, ...; ``paper_logged_test_error`` for the
  figure the paper's training log reports) or dicts (``test_intervals``; ``test_reliability`` with lists
  ``bin_edges``, ``accuracy`` and ``count``, one value per bin);
* ``equivariance_error``: a dict, or null where it was not measured.

Optional: ``notes`` (list of str), ``source`` (str), ``parameters`` (int), ``weights_sha256`` (64 hex digits:
:func:`models.checkpoint.weights_digest` of the weights the card describes; loading refuses weights that do not
match it), ``training``, ``table1`` and ``attention_on_nuclei`` (dicts). ``attention_on_nuclei``
(``benchmarks/attention_on_nuclei.py``) holds under ``readings`` one entry per reading (``kept``, ``removed``,
``spatial``, ``composite``), each with ``what``, ``summary_of`` (the layer its ``summary`` is of) and ``summary``,
the layer readings also ``by_layer``; every summary maps a number (``spearman``, ``tissue_minus_background``, ...)
to its ``mean``, ``low``, ``high``, ``sd``, ``median``, ``share_positive`` and ``n`` over patches; ``layers`` lists
the layers in forward order (the card's JSON sorts keys). Cards measured before the readings (retired ones) keep the
older single-reading summary. ``stain_reference`` (the PCam cards; ``python -m tools.pcam_stain``) is the stain of the
data the model trained on, a :class:`models.stain_normalise.StainEstimate` as ``to_dict`` writes it (``vectors``,
``max_concentrations``, ``lab_mean``, ``lab_std``) beside how it was estimated (``estimated``); read it with
:func:`stain_reference`.
"""

from __future__ import annotations

from numbers import Real

from .stain_normalise import StainError, StainEstimate

__all__ = ["CheckpointError", "validate_card", "stain_reference", "REQUIRED_FIELDS", "INPUT_FIELDS"]

REQUIRED_FIELDS = ("arch", "config", "group", "input", "dataset", "class_names", "metrics", "equivariance_error")
INPUT_FIELDS = ("size", "channels", "mean", "std", "transposed")
GROUPS = ("p4", "p4m")
OPTIONAL_DICTS = ("training", "table1", "attention_on_nuclei", "stain_reference")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded; the message says which file and why."""


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _got(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def validate_card(card, where: str = "model card") -> None:
    """Raise :class:`CheckpointError` unless ``card`` follows the schema of the module docstring.

    Args:
        card: the parsed card.
        where: how messages name it, e.g. ``"model card of run/best.safetensors"``.

    Raises:
        CheckpointError: the first field missing or of the wrong type, with what it holds.
    """
    if not isinstance(card, dict):
        raise CheckpointError(f"{where} is not a JSON object ({_got(card)})")
    missing = [key for key in REQUIRED_FIELDS if key not in card]
    if missing:
        raise CheckpointError(f"{where} lacks field(s) {missing}")

    def bad(field: str, wanted: str):
        value = card
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        raise CheckpointError(f"{where}: '{field}' must be {wanted} (got {_got(value)})")

    if not isinstance(card["arch"], str) or not card["arch"]:
        bad("arch", "an architecture name")
    if not isinstance(card["config"], dict):
        bad("config", "a dict of config fields")
    if card["group"] is not None and card["group"] not in GROUPS:
        bad("group", f"one of {list(GROUPS)} or null")
    _validate_input(card["input"], where)
    dataset = card["dataset"]
    if not isinstance(dataset, dict) or not isinstance(dataset.get("name"), str):
        bad("dataset", "a dict with a 'name'")
    for key in ("source", "notes"):
        if key in dataset and not isinstance(dataset[key], str):
            bad(f"dataset.{key}", "a str")
    if "class_names" in dataset and not _strings(dataset["class_names"]):
        bad("dataset.class_names", "a list of str")
    if "splits" in dataset and not isinstance(dataset["splits"], dict):
        bad("dataset.splits", "a dict")
    if "test_files" in dataset and not _strings(dataset["test_files"]):
        bad("dataset.test_files", "a list of str")
    if not _strings(card["class_names"]) or not card["class_names"]:
        bad("class_names", "a non-empty list of str")
    _validate_metrics(card["metrics"], where)
    if card["equivariance_error"] is not None and not isinstance(card["equivariance_error"], dict):
        bad("equivariance_error", "a dict or null")
    if "notes" in card and not _strings(card["notes"]):
        bad("notes", "a list of str")
    if "source" in card and not isinstance(card["source"], str):
        bad("source", "a str")
    if "parameters" in card and (not isinstance(card["parameters"], int) or isinstance(card["parameters"], bool)):
        bad("parameters", "an int")
    digest = card.get("weights_sha256")
    if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                   and all(c in "0123456789abcdef" for c in digest)):
        bad("weights_sha256", "64 lowercase hex digits")
    for key in OPTIONAL_DICTS:
        if key in card and not isinstance(card[key], dict):
            bad(key, "a dict")
    if "stain_reference" in card:
        try:
            StainEstimate.from_dict(card["stain_reference"])
        except StainError as err:
            raise CheckpointError(f"{where}: 'stain_reference' is not a stain estimate ({err})") from None


def stain_reference(card: dict) -> StainEstimate | None:
    """The stain of the data the card's model trained on (its ``stain_reference``), or None where it has none:
    the target an image is normalised to before this model sees it."""
    value = card.get("stain_reference") if isinstance(card, dict) else None
    return None if value is None else StainEstimate.from_dict(value)


def _validate_input(spec, where: str) -> None:
    missing = [key for key in INPUT_FIELDS if not isinstance(spec, dict) or key not in spec]
    if missing:
        raise CheckpointError(f"{where}: 'input' lacks field(s) {missing}")
    for key in ("size", "channels"):
        if not isinstance(spec[key], int) or isinstance(spec[key], bool) or spec[key] < 1:
            raise CheckpointError(f"{where}: input {key} must be a positive int (got {_got(spec[key])})")
    for key in ("mean", "std"):
        if not isinstance(spec[key], list) or not all(_number(v) for v in spec[key]):
            raise CheckpointError(f"{where}: input {key} must be a list of numbers (got {_got(spec[key])})")
    if len(spec["mean"]) != spec["channels"] or len(spec["std"]) != spec["channels"]:
        raise CheckpointError(f"{where}: input mean/std need one value per channel ({spec['channels']})")
    if not all(v > 0 for v in spec["std"]):
        raise CheckpointError(f"{where}: input std must be positive (got {spec['std']})")
    if not isinstance(spec["transposed"], bool):
        raise CheckpointError(f"{where}: input transposed must be true or false (got {_got(spec['transposed'])})")


def _validate_metrics(metrics, where: str) -> None:
    if not isinstance(metrics, dict):
        raise CheckpointError(f"{where}: 'metrics' must be a dict (got {_got(metrics)})")
    for key, value in metrics.items():
        if not (value is None or _number(value) or isinstance(value, dict)):
            raise CheckpointError(f"{where}: metric '{key}' must be a number, a dict or null (got {_got(value)})")
    curve = metrics.get("test_reliability")
    if curve is not None:
        lists = [curve.get(key) if isinstance(curve, dict) else None for key in ("bin_edges", "accuracy", "count")]
        if not all(isinstance(v, list) for v in lists) or not len(lists[0]) - 1 == len(lists[1]) == len(lists[2]):
            raise CheckpointError(f"{where}: metric 'test_reliability' must hold lists bin_edges, accuracy and "
                                  "count, one accuracy and count per bin")
