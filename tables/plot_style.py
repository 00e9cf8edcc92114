"""How every table figure looks, and how it is written: titles wrapped to the figure, one colour
and line per row, error bars cut at what a metric can take, and PNGs saved with a palette.

Why a palette: a table's figures are line and marker drawings on white in a few dozen colours
(their anti-aliased edges add shades); saved as 8-bit palette PNGs they are the same figures at
about a third of the bytes of matplotlib's RGBA output (docs/results: 4.8 MB of figures became
about 1.7 MB), which keeps the published results folder small. Pillow is imported only where a figure
is saved (every cli.py start imports this module's callers).
"""
from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from tables.ranges import UNSTABLE, cell_bounds
from tables.runs import variant_of

if TYPE_CHECKING:
    from PIL.Image import Image as PilImage

PALETTE_COLOURS = 256
DPI = 100


def palette(image: PilImage) -> PilImage:
    """An image's colours reduced to a 256-colour palette by median cut, without dithering (flat
    areas stay flat); an opaque RGBA image loses its alpha channel, which says nothing, and one with
    transparency keeps it (an RGBA palette)."""
    from PIL import Image

    image.load()
    if image.mode == "RGBA" and image.getextrema()[3][0] == 255:
        image = image.convert("RGB")
    if image.mode in ("RGBA", "LA", "PA"):
        return image.convert("RGBA").quantize(colors=PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE,
                                              dither=Image.Dither.NONE)
    return image.convert("RGB").quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT,
                                         dither=Image.Dither.NONE)


def save_png(fig: Any, path: Path, dpi: int = DPI) -> None:
    """The figure as matplotlib renders it, saved as a palette PNG (`palette`)."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    buffer.seek(0)
    palette(Image.open(buffer)).save(path, format="PNG", optimize=True)


def suptitle(fig: Any, table: Any, what: str = "", fontsize: float = 10) -> None:
    """The figure's title, wrapped to the figure's own width (about 13 characters an inch at 10
    points): a title wrapped to a fixed count ran off both edges of the narrower figures."""
    chars = max(40, int(fig.get_figwidth() * 130 / fontsize))
    fig.suptitle(title(table, what, width=chars), fontsize=fontsize)


def title(table: Any, what: str = "", width: int = 80) -> str:
    """The table's title (and what the figure shows), wrapped so it fits the figure."""
    text = table.title or table.name
    if getattr(table, "quick", False):  # not the table's result: the figures say so too
        text = f"Quick form (table.quick=true) of: {text}"
    return textwrap.fill(f"{text}: {what}" if what else text, width)


def variants_in(labels: Sequence[str]) -> list[str]:
    """The labels' variants in first-seen order (one panel or front each); [""] for none."""
    return list(dict.fromkeys(variant_of(label) for label in labels)) or [""]


def clipped_error(mean: float, half: Optional[float], low: float = 0.0, high: float = 1.0) -> tuple[float, float]:
    """(below, above) error-bar lengths of a t interval cut at what the metric can take: three
    seeds' intervals of an accuracy run past 1 and below 0, which no accuracy can."""
    half = half or 0.0
    return mean - max(low, mean - half), min(high, mean + half) - mean


def bounds(metric: str) -> tuple[float, float]:
    """What a metric can take: [0, 1] for an accuracy, [0, inf) for a loss or a count."""
    return cell_bounds(metric)


def unstable_mark(rec: dict[str, Any]) -> dict[str, Any]:
    """How a row marked unstable (tables/ranges.py) is drawn: a hollow marker, so that its interval,
    cut at the metric's range, is not read as a tight one."""
    return {"mfc": "white", "mew": 1.2} if rec.get(UNSTABLE) else {}


def unstable_name(rec: dict[str, Any], name: str) -> str:
    return f"{name} (unstable)" if rec.get(UNSTABLE) else name


def metric_label(metric: str) -> str:
    return {"test_acc": "test accuracy", "test_loss": "test loss", "val_acc": "validation accuracy",
            "val_loss": "validation loss"}.get(metric, metric.replace("_", " "))


def row_styles(plt: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """A colour and line per row, the same in every panel: tab20's 20 colours, then dashed, then
    dotted, so that past matplotlib's 10-colour default cycle no two rows share a look."""
    palette = plt.get_cmap("tab20")
    return {n: {"color": palette(i % 20), "fmt": "o" + ["-", "--", ":"][i // 20 % 3]} for i, n in enumerate(names)}


