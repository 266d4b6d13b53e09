"""The patch page's stain: the "Stain" control (as scanned, or normalised to PCam's stain) and the "Stain stability"
tab (:mod:`app.analysis.stain_stability` computes it; :mod:`app.pictures.stain_panels` draws it). H&E models whose
card holds PCam's reference stain only: other models get neither."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from models.stain_normalise import StainEstimate

from ..analysis.compute import Analysis
from ..analysis.stain_stability import (
    PERTURBATIONS,
    SEED,
    STAIN_LABELS,
    StainStability,
    group_spread,
    stain_reference,
)
from ..pictures.plots import PanelMarks
from ..pictures.stain_panels import stability_figure
from .caches import stain_stable
from .inputs import LoadedModel
from .views import Display

__all__ = ["STAIN_TAB", "page_reference", "stain_ui", "show_stain_stability", "stability_rows", "spread_rows"]

STAIN_TAB = "Stain"  # "Stain stability" made the tab bar overflow a 1440-pixel window with every shipped model
SHORT = {"none": "scanned", "macenko": "Macenko", "reinhard": "Reinhard"}  # the per-perturbation table's columns
STAIN_HELP = ("What the model sees. As scanned: the pixels as given. Normalised to PCam: each pixel's colour mapped "
              "from this patch's own stain to PCam's (the reference estimated from PCam's training split, in the "
              "model's card): Macenko's stain vectors (haematoxylin and eosin) and concentration range, or "
              "Reinhard's colour statistics. Both act on each pixel's colour alone, so they commute with every turn "
              "and mirror, and the proof stays exact.")


def page_reference(card: dict) -> StainEstimate | None:
    """The card's reference stain where the page offers the Stain control; None (after saying why, should the card
    hold a malformed one) otherwise."""
    try:
        return stain_reference(card)
    except ValueError as error:  # StainError: the card's value cannot be read
        st.sidebar.caption(f"No stain normalisation: {error}")
        return None


def stain_ui(reference: StainEstimate | None) -> str:
    """Sidebar, under the image: as scanned or normalised to PCam (Macenko, Reinhard); ``"none"`` without a
    reference (no control is drawn then)."""
    if reference is None:
        return "none"
    return st.sidebar.radio("Stain", list(STAIN_LABELS), format_func=STAIN_LABELS.get, key="stain", help=STAIN_HELP)


def stability_rows(stability: StainStability) -> list[dict]:
    """One row per perturbation: its size, P(tumour), the maps' mean |change| and correlation, per method."""
    rows = []
    for i, p in enumerate(stability.perturbations):
        row = {"perturbation": p.name, "σ = bias": p.sigma}
        for method in stability.methods:
            short = SHORT[method]
            row[f"P(tumour), {short}"] = float(stability.probability[method][i])
            if stability.layer is not None:
                row[f"mean |Δα_s|, {short}"] = float(stability.change[method][i])
                r = stability.correlation[method][i]
                row[f"r, {short}"] = None if np.isnan(r) else float(r)
        rows.append(row)
    return rows


def spread_rows(stability: StainStability, analysis: Analysis, border: int) -> list[dict]:
    """The stain's spread under each method beside the group's (the equivariance proof's error on the page's
    image): P(tumour)'s max - min and the maps' mean |change|."""
    rows = []
    perturbed = len(stability.perturbations) - 1
    for method in stability.methods:
        rows.append({"what moves the patch": f"{perturbed} stain perturbations, {STAIN_LABELS[method]}",
                     "P(tumour) max − min": stability.spread(method),
                     "mean |Δα_s|": stability.mean_change(method) if stability.layer else None,
                     "lowest r": stability.lowest_correlation(method) if stability.layer else None})
    group = group_spread(analysis, stability.layer, border)
    rows.append({"what moves the patch": f"{group.transforms - 1} turns and mirrors (the equivariance proof)",
                 "P(tumour) max − min": group.spread, "mean |Δα_s|": group.mean_change,
                 "lowest r": group.lowest_correlation})
    return rows


def _sentence(stability: StainStability, analysis: Analysis, border: int) -> str:
    """The two spreads in one sentence: the stain's (as scanned, normalised) against the group's."""
    group = group_spread(analysis, stability.layer, border)
    normalised = stability.methods[1] if len(stability.methods) > 1 else None
    text = ("**Stain stability.** Stain moves this patch's P(tumour) by up to "
            f"**{stability.spread('none'):.3g}** as scanned"
            + (f" and **{stability.spread(normalised):.3g}** {STAIN_LABELS[normalised]}" if normalised else ""))
    if stability.layer is not None and group.mean_change is not None:
        text += (f", and its α_s map ({stability.layer}) by **{stability.mean_change('none'):.2g}** on average"
                 + (f" (**{stability.mean_change(normalised):.2g}** normalised)" if normalised else ""))
    text += (f". Turns and mirrors move P(tumour) by **{group.spread:.1e}**"
             + (f" and the map by **{group.mean_change:.1e}**" if group.mean_change is not None else "")
             + ": round-off, since the model is equivariant; it is not stain invariant.")
    return text


def show_stain_stability(loaded: LoadedModel, scanned: np.ndarray, method: str, analysis: Analysis, border: int,
                         display: Display, marks: PanelMarks | None, element: int = 0, degrees: float = 0.0) -> None:
    """The tab: the patch as scanned under :data:`PERTURBATIONS`, each as scanned and normalised (the page's
    normalisation, Macenko while the page shows the patch as scanned), through the model; ``analysis`` is the
    page's, in the spatial reading (its proof gives the group's row)."""
    normalisation = method if method != "none" else "macenko"
    with st.spinner(f"The patch under {len(PERTURBATIONS)} stain perturbations, as scanned and "
                    f"{STAIN_LABELS[normalisation]} ..."):
        stability = stain_stable(loaded, scanned, normalisation, border, element, degrees)
    if stability.error:
        st.info(f"{stability.error} Only the patch as scanned is shown.")
    st.markdown(_sentence(stability, analysis, border))
    # One table, numbers of very different sizes (stain: 1e-2, the group: 1e-8): three significant digits each.
    formats = {"P(tumour) max − min": st.column_config.NumberColumn(format="%.3g"),
               "mean |Δα_s|": st.column_config.NumberColumn(format="%.3g"),
               "lowest r": st.column_config.NumberColumn(format="%.6f")}
    st.dataframe(pd.DataFrame(spread_rows(stability, analysis, border)), hide_index=True, key="stain_spread",
                 column_config=formats)
    light, strong = (next(p for p in PERTURBATIONS if p.name.startswith(k)) for k in ("HED-light", "HED-strong"))
    layer = (f"the first attentive layer's α_s ({stability.layer}, mean over channels, at the patch's size"
             + (f", {border} px of padding border left out" if stability.border else "") + ")"
             if stability.layer else "no map: this model has no spatial attention")
    st.caption(
        f"Perturbations: the patch itself, then Tellez et al.'s HED jitter (each stain's concentration c becomes "
        f"c (1 + a) + b, a and b uniform): {sum(p.sigma == light.sigma for p in PERTURBATIONS)} at HED-light size "
        f"σ = bias = {light.sigma}, {sum(p.sigma == strong.sigma for p in PERTURBATIONS)} at HED-strong "
        f"σ = bias = {strong.sigma}, seeded ({SEED}, index): the same on every run. Maps: {layer}. Δα_s is the "
        "mean absolute change from the unperturbed patch's map and r their Pearson correlation; the group's row "
        "measures maps(g.x) against g.maps(x) on the image the page shows, over every transform.")
    if stability.layer is not None:
        fig = stability_figure(stability, range_mode=display.range_mode, colorscale=display.colorscale,
                               opacity=display.opacity,
                               marks=PanelMarks(marks.centre) if marks is not None else None)
        st.plotly_chart(fig, key="stain_maps", config={"displaylogo": False, "displayModeBar": False})
    rows = stability_rows(stability)
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="stain_table",
                 column_config={k: st.column_config.NumberColumn(format="%.4f")
                                for k in rows[0] if k not in ("perturbation", "σ = bias")})
