"""The data sets, one file each, behind one registry (`data=NAME`, `data.name`).

Every module in this package is imported on first use of `DATASETS`, so a data set registers
itself just by living here: a `DataSet` subclass (data/sets/base.py) and
`register_dataset(Instance())`. `data.register_configs` turns each into a Hydra option, and tests
enumerate `DATASETS.names()`.
"""
from __future__ import annotations

from core.registry import Registry
from data.sets.base import DataSet

DATASETS: Registry[DataSet] = Registry("data set", "data.name", packages=["data.sets"], skip={"base"})


def register_dataset(dataset: DataSet) -> DataSet:
    """Make `dataset` the entry `dataset.name` (`data=NAME`); returns it."""
    DATASETS.add(dataset.name, dataset)
    return dataset
