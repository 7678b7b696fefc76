"""The docs stay true: the configuration reference matches the traits' help."""

import runpy
from pathlib import Path

import pytest

from gpulab_hub.accounts.auth import GpulabAuthenticator
from gpulab_hub.cluster.spawner import ProjectSlurmSpawner
from gpulab_hub.spawner import ProjectSpawner

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_reference_is_generated_from_the_code():
    gen = runpy.run_path(str(DOCS / "generate_reference.py"))
    assert (DOCS / "reference.md").read_text() == gen["render"](), (
        "docs/reference.md is stale: run .venv/bin/python docs/generate_reference.py"
    )


@pytest.mark.parametrize("cls", [ProjectSpawner, ProjectSlurmSpawner, GpulabAuthenticator])
def test_every_setting_says_its_default_and_gives_an_example(cls):
    gen = runpy.run_path(str(DOCS / "generate_reference.py"))
    for name, trait in gen["gpulab_traits"](cls).items():
        assert "Default" in trait.help, f"{cls.__name__}.{name} help lacks its default"
        assert f"c.{cls.__name__}.{name} = " in trait.help, (
            f"{cls.__name__}.{name} lacks an example"
        )
