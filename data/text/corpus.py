"""A character corpus held in memory: the form of a text data set (`DataSet.form`).

The text is one uint8 tensor of token ids over a fixed vocabulary (a data set records its
vocabulary in code, so a corpus that brings a new symbol is refused rather than silently
re-numbered), with the boundaries of its speeches and each speech's sources (play, speaking
role), which the source partition reads. The device pipeline copies the ids to the training
device once and cuts windows out of them there (`data.text.windows`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
import torch

from core.errors import UserError

SOURCE_UNITS = ("play", "role")


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class TextCorpus:
    ids: torch.Tensor  # uint8, one token id per character, in reading order
    vocab: str  # id i is vocab[i]
    speech_bounds: np.ndarray  # int64, speeches' start offsets and the end (S + 1)
    speech_sources: dict[str, np.ndarray]  # unit ("play", "role") -> int64 source id of every speech
    source_names: dict[str, list[str]]  # unit -> the sources' names, by id
    sha256: str  # of the text's bytes (ASCII)

    in_memory: ClassVar[bool] = True
    windows: ClassVar[bool] = True  # read as windows of tokens, not as samples with labels

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_bytes(self) -> int:
        return len(self.ids)  # one byte per character: the vocabulary is ASCII

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    @classmethod
    def from_speeches(cls, texts: Sequence[str], sources: dict[str, Sequence[str]], vocab: str,
                      what: str) -> "TextCorpus":
        """The corpus of these speeches in order; `sources[unit][i]` names speech i's source.
        A character outside `vocab` is a one-line `UserError` naming it (`what`: the corpus)."""
        text = "".join(texts)
        raw = text.encode("ascii", errors="replace")
        table = np.full(256, 255, dtype=np.uint8)
        table[np.frombuffer(vocab.encode("ascii"), dtype=np.uint8)] = np.arange(len(vocab), dtype=np.uint8)
        ids = table[np.frombuffer(raw, dtype=np.uint8)]
        if (ids == 255).any():
            bad = sorted(set(text) - set(vocab))
            raise UserError(f"{what} holds characters outside its recorded vocabulary ({''.join(bad)!r}); it is not "
                            "the pinned corpus: reinstall it with scripts/setup_env.sh")
        bounds = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
        ids_of, names_of = {}, {}
        for unit, names in sources.items():
            order = list(dict.fromkeys(names))
            index = {name: i for i, name in enumerate(order)}
            ids_of[unit] = np.array([index[n] for n in names], dtype=np.int64)
            names_of[unit] = order
        return cls(torch.from_numpy(ids.copy()), vocab, bounds, ids_of, names_of, hashlib.sha256(raw).hexdigest())
