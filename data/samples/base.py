"""What every form of samples offers the pipelines and `data.prepare` (see `data.samples`)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Sequence

from data.config import FFCVConfig


class Samples(ABC):
    """One split of a data set, index by index, in the data set's reading order."""

    #: DALI reads this form's files where they lie (no copy by `data.prepare`)
    dali_reads_in_place: ClassVar[bool] = False
    #: suffix of the one-file-per-sample copy `data.prepare` writes for DALI
    dali_suffix: ClassVar[str] = ""
    #: the whole split is in memory as arrays (`tensors_nhwc`): the device pipeline can hold it
    in_memory: ClassVar[bool] = False

    @abstractmethod
    def __len__(self) -> int:
        ...

    @abstractmethod
    def item(self, index: int) -> tuple[Any, int]:
        """(image, label) as the data set's torchvision transforms take it."""

    @abstractmethod
    def label_array(self) -> Any:
        """Every sample's label in index order (a numpy int64 array), read without the images:
        what `data.split` carves the validation set from and partitions."""

    @abstractmethod
    def ffcv_field(self, ffcv: FFCVConfig) -> Any:
        """The FFCV field the images are written to (called where FFCV is imported)."""

    @abstractmethod
    def ffcv_rows(self) -> Sequence[tuple[Any, int]]:
        """(image, label) rows in index order, as FFCV's writer takes them."""

    @classmethod
    def ffcv_settings(cls, ffcv: FFCVConfig) -> dict[str, Any]:
        """The writer settings the `.beton` depends on, recorded in its manifest."""
        return {}

    def tensors_nhwc(self) -> tuple[Any, Any]:
        """(images N x H x W x C, labels) as CPU tensors without copying where possible (forms
        with `in_memory`), for the device pipeline."""
        raise NotImplementedError(f"{type(self).__name__} is not held in memory")

    def write_dali_file(self, index: int, path: Path) -> None:
        """Write sample `index` to `path` (suffix `dali_suffix`) for DALI to decode."""
        raise NotImplementedError(f"{type(self).__name__} is read by DALI in place")

    def files_in_place(self) -> tuple[list[str], list[int]]:
        """(files, labels) for DALI to read where they lie (forms with `dali_reads_in_place`)."""
        raise NotImplementedError(f"{type(self).__name__} is read by DALI from a prepared copy")
