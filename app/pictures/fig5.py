"""The paper's Fig. 5 in its layout: patches in rows, each shown in several transforms with its composite attention
map and that map's arrow field.

The paper's figure draws the composite of :mod:`app.analysis.composite`: the product over every attentive layer of
its spatial attention alpha_s (the factor of what the layer *removes*), summed over orientations, viridis, and an
arrow per orientation. Here each patch row shares one colour scale (the sum of a transformed patch is the sum of
the patch moved, so equal colours show that), and the arrows are those of the app
(:func:`app.pictures.arrows.arrow_field` on the composite's per-orientation maps, ``selectivity`` mode: the
orientations that stand out at a place), drawn as its export draws them. ``fig5_png(model, card, images, titles)``
gives the PNG; ``python -m app.pictures.fig5`` writes ``docs/fig5.png`` from test patches of pcam_public.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from PIL import Image

from ..analysis.compute import analyse
from ..analysis.images import fit_to_model, read_image
from ..analysis.pcam_public import public_folder, test_patches
from ..analysis.readings import BRIGHT, COMPOSITE, LABELS
from .arrows import ArrowField, arrow_field
from .figures import draw_arrow_panel, png_bytes

__all__ = ["Fig5Row", "fig5_rows", "fig5_png", "FIG5_TRANSFORMS", "DEFAULT_FILES"]

# Group elements shown per patch (p4m numbering): the patch, turned a quarter, mirrored.
FIG5_TRANSFORMS = (0, 1, 4)
# Test patches of pcam_public for docs/fig5.png: a tumour and a normal patch all tissue, and one of each with
# glass (39 and 30 % of the patch).
DEFAULT_FILES = (
    "test/001420c122317df5d16f35c84a74437a7689b63c.jpg",
    "test/072211464cc0ab3ad3f75f68a56e15c62f141bff.jpg",
    "test/005dbb73a8d6dc089d58bcfac5844f231583f0b5.jpg",
    "test/031657837428d0ec714aea91384388dbd4e841ed.jpg",
)


@dataclass(frozen=True)
class Fig5Row:
    """One patch's panels.

    Attributes:
        title: the row's label.
        images: ``(K, C, S, S)`` the K transforms of the patch, in [0, 1].
        composite: ``(K, S, S)`` the composite summed over orientations, per transform.
        field: the arrow field of the composite over every analysed transform.
        transforms: K indices into ``field.lengths`` (and the analysis' elements).
        names: K element names, e.g. ``"rot 90°"``.
    """

    title: str
    images: np.ndarray
    composite: np.ndarray
    field: ArrowField
    transforms: tuple[int, ...]
    names: tuple[str, ...]


def fig5_rows(model, card: dict, images: list[np.ndarray], titles: list[str],
              transforms: tuple[int, ...] = FIG5_TRANSFORMS) -> list[Fig5Row]:
    """The numbers behind :func:`fig5_png`: each image analysed once in every transform (the app's analysis).

    Args:
        model: a registered group network in eval mode, with spatial attention.
        card: its model card.
        images: ``(C, S, S)`` in [0, 1], fitted to the model (:func:`app.analysis.images.fit_to_model`).
        titles: one per image.
        transforms: group elements to show; those the model's group lacks (mirrors for p4) are left out.

    Raises:
        ValueError: a model without a composite (no group or no spatial attention); titles not one per image.
    """
    if len(titles) != len(images):
        raise ValueError(f"one title per image: {len(titles)} titles for {len(images)} images")
    rows = []
    for image, title in zip(images, titles, strict=True):
        analysis = analyse(model, card, image)
        if analysis.composite is None:
            raise ValueError(f"{getattr(model, 'arch', 'this model')} has no spatial attention (or no group): the "
                             "paper's composite, and so Fig. 5, does not exist for it")
        shown = tuple(t for t in transforms if t < len(analysis.elements))
        composite = analysis.composite.maps[list(shown)].sum(axis=1)  # (K, G, S, S) -> (K, S, S)
        # Arrows of the logarithm: the composite is a product, and near the padded edges it is orders of magnitude
        # above its interior, so linear differences would draw arrows at the corners only; log differences compare
        # ratios everywhere. Eight cells a side, not the app's twelve: the panels here are small.
        logarithm = dataclasses.replace(analysis.composite, maps=np.log(analysis.composite.maps),
                                        expected=np.log(analysis.composite.expected))
        field = arrow_field(logarithm, image.shape[-1], spacing=image.shape[-1] // 8)
        rows.append(Fig5Row(title, analysis.images[list(shown)], composite, field, shown,
                            tuple(analysis.element_names[t] for t in shown)))
    return rows


def fig5_png(model, card: dict, images: list[np.ndarray], titles: list[str],
             transforms: tuple[int, ...] = FIG5_TRANSFORMS, dpi: int = 100) -> bytes:
    """The paper's Fig. 5 for ``images``: a row per image; per transform the patch, the composite and its arrows.

    Arguments as :func:`fig5_rows`; ``dpi`` of a figure 1.6 inches a panel wide. Returns PNG bytes.
    """
    rows = fig5_rows(model, card, images, titles, transforms)
    columns = 3 * len(rows[0].transforms)
    fig = Figure(figsize=(1.6 * columns + 1.2, 1.78 * len(rows) + 0.9))
    grid = fig.subplots(len(rows), columns, squeeze=False,
                        gridspec_kw={"wspace": 0.05, "hspace": 0.28, "left": 0.08, "right": 0.93, "top": 0.86,
                                     "bottom": 0.02})
    orientations = rows[0].field.lengths.shape[1]
    for r, (row, axes) in enumerate(zip(rows, grid, strict=True)):
        # One colour scale per patch: its transforms' maps are the same values moved, so colours must match. Log,
        # because the edges are orders of magnitude above the interior: a linear scale leaves the interior one colour.
        low, high = float(row.composite.min()), float(row.composite.max())
        shown = None
        for k, (t, name) in enumerate(zip(row.transforms, row.names, strict=True)):
            patch, composite, arrows = axes[3 * k:3 * k + 3]
            patch.imshow(np.clip(row.images[k].transpose(1, 2, 0), 0, 1), interpolation="nearest")
            shown = composite.imshow(row.composite[k], cmap="viridis", norm=LogNorm(low, high), interpolation="nearest")
            draw_arrow_panel(arrows, row.field, t, row.images[k])
            for ax in (patch, composite):
                ax.set_axis_off()
            if r == 0:
                patch.set_title(name, fontsize=9)
                composite.set_title(f"Σ over {orientations} orientations", fontsize=8)
                arrows.set_title("per orientation", fontsize=8)
        axes[0].text(-0.08, 0.5, row.title, transform=axes[0].transAxes, rotation=90, ha="right", va="center",
                     fontsize=8)
        bar = fig.colorbar(shown, ax=list(axes), fraction=0.012, pad=0.01, format="%.1e")
        bar.ax.tick_params(labelsize=6)
    # The readings' own words (app.analysis.readings), as the page's captions use them.
    fig.suptitle(f"The paper's Fig. 5 picture: {LABELS[COMPOSITE]}. {BRIGHT[COMPOSITE]}\n"
                 "Per patch: the patch, its map summed over orientations "
                 "(one log colour scale per row), and the arrows of the orientations whose map stands out there "
                 "(ratios; solid: rotations, hollow: mirrored)", fontsize=9)
    return png_bytes(fig, dpi)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the paper's Fig. 5 for test patches of pcam_public.")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/fa_p4m_densenet_pcam.safetensors"))
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES),
                        help="test patches, as labels.csv names them (default: the four of docs/fig5.png)")
    parser.add_argument("--out", type=Path, default=Path("docs/fig5.png"))
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(argv)
    from models import load_checkpoint

    model, card = load_checkpoint(args.checkpoint)
    labels = {patch.file: patch.label for patch in test_patches()}
    missing = [f for f in args.files if f not in labels]
    if missing or not args.files:
        print(f"error: not test patches of {public_folder()}: {', '.join(missing) or 'none named'}", file=sys.stderr)
        return 1
    spec = card["input"]
    images = [fit_to_model(read_image((public_folder() / f).read_bytes()), spec["size"], spec["channels"]).pixels
              for f in args.files]
    titles = [f"{'tumour' if labels[f] else 'normal'} {Path(f).stem[:10]}" for f in args.files]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(io.BytesIO(fig5_png(model, card, images, titles, dpi=args.dpi))) as picture:
        # A palette of 256 colours: a third of the size, small enough to commit, and the maps still read.
        picture.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(args.out, optimize=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
