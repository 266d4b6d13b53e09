"""Fig. 5 over seeds: does attention fall on nuclei the same way in every seed of Table 3's attentive models?

    python -m experiments table3 --seeds          # after the table and the claims over seeds

Each run's ``attention_on_nuclei`` (``python -m benchmarks.attention_on_nuclei ... --results-card CARD``, all 1,944
test patches) from its card in ``results/pcam_table3`` (seed 0) or ``results/pcam_table3_seeds``. Per layer and
seed: the mean over patches of ρ, the rank correlation of the map with haematoxylin over the patch, in two
readings: α_s (the spatial attention, what the paper's figures draw) and α⁺ = 1 − α_c·α_s (what the layer keeps;
ρ of α⁻ is its exact negative). The paper's composite (the product of every layer's α_s) closes each table. A sign
holds at a layer when every seed's 95 % interval (over the patches) lies on the same side of 0: the intervals speak
for these networks on patches like these, the seeds for the recipe.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ATTENTIVE", "READINGS", "nuclei_entries", "sign", "nuclei_markdown"]

ATTENTIVE = ("fa_p4m_densenet", "fa_p4_densenet")
READINGS = {"spatial": "α_s", "kept": "α⁺"}
COMPOSITE = "composite"
WORDS = {-1: "negative", 1: "positive", 0: "not resolved"}


def nuclei_entries(folders: dict[int, Path]) -> dict[str, dict[int, dict]]:
    """``{model: {seed: attention_on_nuclei}}`` of every attentive run whose card holds the measurement.

    Args:
        folders: each seed's results folder (:data:`experiments.table3_over_seeds.FOLDERS`).
    """
    found: dict[str, dict[int, dict]] = {}
    for model in ATTENTIVE:
        for seed in sorted(folders):
            card = folders[seed] / f"{model}-seed{seed}.json"
            entry = json.loads(card.read_text()).get("attention_on_nuclei") if card.is_file() else None
            if entry and entry.get("readings", {}).get("spatial", {}).get("by_layer"):
                found.setdefault(model, {})[seed] = entry
    return found


def sign(summary: dict) -> int:
    """+1 or -1 where the 95 % interval lies above or below 0, else 0."""
    return 1 if summary["low"] > 0 else -1 if summary["high"] < 0 else 0


def _rho(entry: dict, reading: str, layer: str) -> dict | None:
    readings = entry["readings"]
    if layer == COMPOSITE:
        return readings[COMPOSITE]["summary"]["spearman"] if reading == "spatial" else None
    row = readings.get(reading, {}).get("by_layer", {}).get(layer)
    return None if row is None else row["spearman"]


def _cell(summary: dict | None) -> str:
    if summary is None:
        return "-"
    return f"{summary['mean']:+.3f}" + ("" if sign(summary) else " (ns)")


def _verdict(signs: dict[int, int]) -> str:
    """The sign over the seeds, or which seed says what."""
    said = set(signs.values())
    if said == {0}:
        return "not resolved on any seed"
    if len(said) == 1:
        return f"{WORDS[said.pop()]} " + ("on every seed" if len(signs) > 1 else f"(seed {next(iter(signs))} alone)")
    return "differs: " + ", ".join(f"seed {s} {WORDS[v]}" for s, v in signs.items())


def nuclei_markdown(entries: dict[str, dict[int, dict]]) -> str:
    """Per attentive model, the table per layer and seed, the verdict on α_s's sign per layer, and a sentence."""
    lines, sentences = [], []
    for model in ATTENTIVE:
        by_seed = entries.get(model)
        if not by_seed:
            sentences.append(f"{model}: no seed measured yet")
            continue
        seeds = sorted(by_seed)
        layers = [*next(iter(by_seed.values()))["layers"], COMPOSITE]
        head = [f"ρ {symbol} seed {s}" for symbol in READINGS.values() for s in seeds]
        lines += [f"**{model}** (seeds {', '.join(map(str, seeds))}; ρ with haematoxylin, mean over "
                  f"{next(iter(by_seed.values()))['patches']} test patches; (ns): its 95 % interval holds 0)", "",
                  "| layer | " + " | ".join(head) + " | sign of ρ α_s over seeds |", "|" + "---|" * (len(head) + 2)]
        holding = 0
        for layer in layers:
            cells = [_cell(_rho(by_seed[s], reading, layer)) for reading in READINGS for s in seeds]
            signs = {s: sign(_rho(by_seed[s], "spatial", layer)) for s in seeds}
            verdict = _verdict(signs)
            holding += layer != COMPOSITE and verdict.endswith("on every seed")
            name = "the paper's composite" if layer == COMPOSITE else f"`{layer}`"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {verdict} |")
        lines.append("")
        first = _verdict({s: sign(_rho(by_seed[s], "spatial", layers[0])) for s in seeds})
        composite = _verdict({s: sign(_rho(by_seed[s], "spatial", COMPOSITE)) for s in seeds})
        sentences.append(f"{model}: the sign of α_s on nuclei holds over seeds {', '.join(map(str, seeds))} at "
                         f"{holding} of {len(layers) - 1} layers (the first, `{layers[0]}`: {first}; the "
                         f"composite: {composite})")
    return "\n".join(lines + ["; ".join(sentences) + "."])
