"""Compose the Hydra tree under params/ into one mapping, exactly as `dvc exp run` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def compose(config_dir: str | Path, overrides: list[str] | None = None, config_name: str = "config") -> dict[str, Any]:
    """Compose `config_dir/config_name.yaml` with Hydra `overrides` into a plain dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(Path(config_dir).resolve()), version_base=None):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides or []))
    OmegaConf.resolve(cfg)
    return OmegaConf.to_container(cfg)  # type: ignore[return-value]


def compose_yaml(config_dir: str | Path, overrides: list[str] | None = None, config_name: str = "config") -> str:
    """The text DVC writes to params.yaml for these overrides."""
    return OmegaConf.to_yaml(OmegaConf.create(compose(config_dir, overrides, config_name)))
