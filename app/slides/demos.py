"""The demo images beside the demo slides: ordinary images are slides of one level (issue 59's one path), so the
regions that region mode offered are listed with the slides.

- The CMU-1 region of the gallery (``app/gallery/region_cmu1.jpg``), at the scale the gallery records for it.
- The PCam test mosaic: :data:`MOSAIC_PATCHES` held-out PCam test patches side by side
  (:func:`app.cells.mosaic.pcam_test_mosaic`), written once as a lossless PNG into the user cache with its cells'
  true labels beside it (``.labels.npy``): the cell at each patch's centre is judged in exactly that patch, so the
  heatmap is scored against PCam's own labels. Where pcam_public is not reachable (the Docker image) the mosaic is
  made of the gallery's twelve test patches, under another name.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from models.cpu.user_cache import cache_root

from .entries import SlideEntry, entry_of

__all__ = ["demo_images", "mosaic_entry", "MOSAIC_PATCHES", "CMU_NOTE"]

# 100 patches: a 10 x 10 mosaic of 960 pixels, 784 cells (100 of them labelled) analysed in about 20 s on 2 cores;
# the page evaluates every cell with tissue, the seams between patches too (shown, not scored).
MOSAIC_PATCHES = 100
# Mosaics that could not be made in this process (no labelled patch, or a cache that cannot be written): the listing
# runs on every tile request, and must not build a mosaic of 100 patches again each time.
_UNMADE: set[tuple[Path, int]] = set()
CMU_NOTE = ("CMU-1 is not lymph-node tissue like PCam's (Camelyon16) patches: the model was never trained on such "
            "tissue, and its output here is not a diagnosis. It shows the machinery on a real slide.")


def demos_folder() -> Path:
    return Path(os.environ.get("APP_SLIDE_DEMOS") or cache_root() / "slide-demos")


def demo_images() -> list[SlideEntry]:
    """The CMU-1 region and the PCam test mosaic (built on the first call), each with its scale."""
    from ..gallery import list_regions

    entries = [replace(entry_of(item.path, True, microns_per_pixel=item.microns_per_pixel,
                                note=f"{CMU_NOTE} {item.source}. {item.credit}."), name="CMU-1 region")
               for item in list_regions()]
    mosaic = mosaic_entry()
    return entries + ([mosaic] if mosaic is not None else [])


def mosaic_entry(folder: Path | None = None, count: int = MOSAIC_PATCHES) -> SlideEntry | None:
    """The PCam test mosaic's entry, its PNG, labels and source written into ``folder`` (default
    :func:`demos_folder`) the first time; None where no labelled patch is reachable or the folder cannot be made."""
    from ..analysis.pcam_public import public_folder, test_patches
    from ..cells.mosaic import PCAM_MPP, SEED, pcam_test_mosaic

    folder = folder or demos_folder()
    if (folder, count) in _UNMADE:
        return None
    path = folder / f"pcam-test-mosaic-{count}-seed{SEED}.png"
    if not path.is_file() and len(test_patches(public_folder())) < count:
        path = folder / "pcam-gallery-mosaic.png"  # pcam_public is not reachable: the gallery's test patches
    labels, about = path.with_suffix(".labels.npy"), path.with_suffix(".json")
    if not (path.is_file() and labels.is_file() and about.is_file()):
        try:
            mosaic = pcam_test_mosaic({}, count=count)  # the gallery's patches where pcam_public lacks them
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # no labelled patch reachable, or a cache that cannot be written: no mosaic, the rest listed
            _UNMADE.add((folder, count))
            return None
        partial = f".{os.getpid()}"  # each file whole before it is seen: two servers may build it at once
        with open(labels.with_name(labels.name + partial), "wb") as handle:  # np.save would append ".npy"
            np.save(handle, mosaic.labels, allow_pickle=False)
        about.with_name(about.name + partial).write_text(json.dumps({"source": mosaic.source}))
        pixels = np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8)  # PCam's patches are 8-bit
        Image.fromarray(pixels).save(path.with_name(path.name + partial), format="PNG")
        for done in (labels, about, path):  # the image last: its presence says the rest is there
            os.replace(done.with_name(done.name + partial), done)
    source = json.loads(about.read_text())["source"]
    return replace(entry_of(path, True, microns_per_pixel=PCAM_MPP, truth=labels, note=source),
                   name="PCam test mosaic (truth known)")
