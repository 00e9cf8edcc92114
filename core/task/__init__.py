"""Tasks behind one registry: what a run optimises and how it is judged.

A task is one module of this package: a `Task` subclass (core/task/base.py: its loss, evaluation
sums and metrics, each metric's direction, its default selection metric) decorated
`@register_task("name")`. The package's modules are imported on first use, as the algorithms'
are, so a task registers itself by living here. The data's spec names its task
(`core.spec.DataSpec.task`, a kind's default: images and signals `classification`, text
`language_model`), and `task_for(spec)` builds it from the registry.

The registry sits on the ground floor because everything that speaks of metrics asks it: the
plan (the default and the validity of `checkpoint.best_metric`), a rank's step and evaluator (the
loss, the sums), the summary and the table layer (names and directions), and none of them may
import another's floor. Plugins never see it: they see parameters, gradients and the optimizer.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from core.registry import Registry
from core.spec import DataSpec
from core.task.base import ACC, LOSS, PREFIXES, SUFFIXES, Metric, Task, base_name

__all__ = ["ACC", "LOSS", "METRIC_DIRECTIONS", "PREFIXES", "SUFFIXES", "TASKS", "Metric", "MetricDirections",
           "Task", "base_name", "register_task", "task_for", "task_names"]

TASKS: Registry[type[Task]] = Registry("task", "spec.task", packages=["core.task"], skip={"base"})


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Register a `Task` subclass as `name` (the name a `DataSpec`'s `task` gives), setting its `name`."""
    return TASKS.register_named(name)


def task_names() -> list[str]:
    return TASKS.names()


def task_for(spec: DataSpec) -> Task:
    """The task of a data set's spec (its `task` field), built from the spec's fields; one line when
    no task of that name is registered."""
    return TASKS.get(spec.task).for_spec(spec)


class MetricDirections(Mapping[str, bool]):
    """Every metric name of every registered task -> whether higher is better, read from the
    registry when asked (a task added later counts). The same name must mean the same direction in
    every task, so that a table that has not run yet can tell `test_bpc` is better lower; two
    tasks that disagree are one error naming both."""

    def __init__(self, registry: Registry[type[Task]]) -> None:
        self.registry = registry

    def table(self) -> dict[str, bool]:
        directions: dict[str, bool] = {}
        declared_by: dict[str, str] = {}
        for task_name, cls in self.registry.items():
            for metric in cls.metrics:
                first = declared_by.setdefault(metric.name, task_name)
                if directions.setdefault(metric.name, metric.higher_is_better) != metric.higher_is_better:
                    raise ValueError(f"metric {metric.name!r} is better {'higher' if metric.higher_is_better else 'lower'} "
                                     f"in the {task_name} task but not in the {first} task; give one of them "
                                     "another name")
        return directions

    def __getitem__(self, name: str) -> bool:
        return self.table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.table())

    def __len__(self) -> int:
        return len(self.table())


#: every metric name of every task, with its direction (`MetricDirections`)
METRIC_DIRECTIONS = MetricDirections(TASKS)
