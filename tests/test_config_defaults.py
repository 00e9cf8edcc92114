"""One source for every default: the YAML options under conf/ carry only what differs from the
typed schema (the dataclass next to each component), so the two cannot drift apart."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from engine.config import RunSchema
from tests.support.harness import CONF

SECTIONS = {f.name: f.default_factory for f in RunSchema.__dataclass_fields__.values()  # type: ignore[attr-defined]
            if callable(getattr(f, "default_factory", None))}
OPTION_FILES = sorted(p for group in SECTIONS if (CONF / group).is_dir() for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("path", OPTION_FILES, ids=[f"{p.parent.name}/{p.name}" for p in OPTION_FILES])
def test_option_files_carry_only_what_differs(path: Path) -> None:
    group = path.parent.name
    defaults = OmegaConf.to_container(OmegaConf.structured(SECTIONS[group]()))
    values = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(values) - set(defaults))
    assert not unknown, f"{path}: keys not in the schema: {unknown}"
    same = [k for k, v in values.items() if k != "name" and defaults[k] == v]
    assert not same, f"{path}: {same} repeat the schema's defaults; leave them to engine's dataclass"


def test_the_run_config_file_holds_no_section_values() -> None:
    """conf/config.yaml picks options and sets Hydra's own settings; values live in the schema."""
    values = yaml.safe_load((CONF / "config.yaml").read_text())
    assert set(values) <= {"defaults", "hydra"}, sorted(values)
    assert values["defaults"][0] == "_syncopt"
