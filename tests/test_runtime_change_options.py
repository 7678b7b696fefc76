"""Change runtime type (home/runtime.py) without a hub: what the page's form becomes,
what it refuses in the user's words, and how the choice is kept for the next start
(the spawn form preselects it; a form without hardware fields keeps it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpulab_hub.home import runtime
from gpulab_hub.projects import options

H100S = options.GpuChoices(max_count=2, default_count=1, types=("H100", "A100"))
MIG = options.GpuChoices(max_count=1, default_count=1, mig_profiles=("1g.10gb",))


def kept(user_options):
    """A spawner whose project keeps ``user_options`` in JupyterHub's database."""
    return SimpleNamespace(orm_spawner=SimpleNamespace(user_options=user_options))


@pytest.mark.parametrize(
    ("form", "chosen", "said"),
    [
        ({"gpus": ["0"]}, {"gpus": 0}, "CPU only"),
        ({"gpus": ["1"]}, {"gpus": 1}, "1 GPU"),
        ({"gpus": ["2"], "gpu_type": ["H100"]}, {"gpus": 2, "gpu_type": "H100"},
         "2 GPUs of type H100"),
        ({"gpus": ["0"], "mig_profile": ["1g.10gb"]}, {"gpus": 0, "mig_profile": "1g.10gb"},
         "one MIG slice 1g.10gb"),
        ({"gpus": ["1"], "gpu_type": [""]}, {"gpus": 1}, "1 GPU"),  # "any" model
    ],
)  # fmt: skip
def test_the_form_becomes_the_spawn_options_and_words(form, chosen, said):
    assert runtime.parse(form) == chosen
    assert runtime.words(chosen) == said


@pytest.mark.parametrize(
    ("form", "said"),
    [
        ({}, "Choose the hardware"),
        ({"gpus": ["two"]}, "The number of GPUs must be a whole number."),
        ({"gpus": ["1 "]}, "The number of GPUs must be a whole number."),
        ({"gpus": ["-1"]}, "The number of GPUs must be a whole number."),
        ({"gpus": ["999"]}, "'gpus' must be between 0 and 64"),
        ({"gpus": ["1"], "gpu_type": ["H100;rm -rf"]}, "must be a GPU model name"),
        ({"gpus": ["0"], "mig_profile": ["big"]}, "must look like '1g.10gb'"),
    ],
)
def test_bad_forms_are_refused_in_words(form, said):
    with pytest.raises(options.OptionsError) as e:
        runtime.parse(form)
    assert said in str(e.value)


def test_a_gpu_is_refused_on_a_computer_without_one():
    runtime.check({"gpus": 0}, None)  # CPU only is always offered
    for chosen in ({"gpus": 1}, {"gpus": 2, "gpu_type": "H100"}, {"mig_profile": "1g.10gb"}):
        with pytest.raises(options.OptionsError) as e:
            runtime.check(chosen, None)
        assert "this computer has no GPU" in str(e.value)
        assert runtime.words(chosen) in str(e.value)


def test_only_what_the_computer_offers_is_accepted():
    runtime.check({"gpus": 2, "gpu_type": "A100"}, H100S)
    runtime.check({"mig_profile": "1g.10gb"}, MIG)
    refused = {
        "at most 2 GPUs": ({"gpus": 3}, H100S),
        "GPU model 'L4' is not offered here; offered: H100, A100.": (
            {"gpus": 1, "gpu_type": "L4"},
            H100S,
        ),
        "MIG slice '2g.20gb' is not offered here; offered: 1g.10gb.": (
            {"mig_profile": "2g.20gb"},
            MIG,
        ),
        "MIG slice '1g.10gb' is not offered here; offered: none.": (
            {"mig_profile": "1g.10gb"},
            H100S,
        ),
    }
    for said, (chosen, choices) in refused.items():
        with pytest.raises(options.OptionsError) as e:
            runtime.check(chosen, choices)
        assert said in str(e.value)


def test_a_new_runtime_replaces_only_the_hardware():
    before = {"stack": "pytorch", "gpus": 2, "gpu_type": "H100", "use_last_good": True}
    assert runtime.with_runtime(before, {"gpus": 0}) == {
        "stack": "pytorch",
        "use_last_good": True,
        "gpus": 0,
    }
    assert runtime.with_runtime(None, {"mig_profile": "1g.10gb"}) == {"mig_profile": "1g.10gb"}


def test_the_kept_choice_is_the_next_starts_default():
    spawner = kept({"stack": "minimal", "gpus": 2, "gpu_type": "H100"})
    assert options.remembered(spawner) == {"gpus": 2, "gpu_type": "H100"}
    # a start form without hardware fields (no GPU choice on the page) keeps it
    assert options.from_form({}, spawner) == {"stack": "minimal", "gpus": 2, "gpu_type": "H100"}
    # a form that names the hardware wins, its "any model" / "a whole GPU" included
    assert options.from_form({"gpus": ["1"], "gpu_type": [""]}, spawner) == {
        "stack": "minimal",
        "gpus": 1,
    }
    # the spawn form preselects it
    html = options.form(None, False, options.GpuChoices(2, 2, ("H100",), (), "H100", ""))
    assert '<option value="2" selected>2</option>' in html
    assert '<option value="H100" selected>H100</option>' in html
    html = options.form(None, False, options.GpuChoices(1, 0, (), ("1g.10gb",), "", "1g.10gb"))
    assert '<option value="1g.10gb" selected>MIG slice 1g.10gb</option>' in html


def test_kept_options_that_are_not_valid_count_as_none():
    # JupyterHub's REST API stores whatever user_options it is given
    for bad in ({"gpus": "2"}, {"gpus": True}, {"gpu_type": "<b>"}, "x", None, {"gpus": 10**6}):
        assert options.remembered(kept(bad)) == {}
    assert options.remembered(SimpleNamespace(orm_spawner=None)) == {}


def test_the_page_address_is_quoted():
    assert runtime.page_url("/hub/", "ann", "lab-1") == "/hub/gpulab/runtime/ann/lab-1"
    assert runtime.page_url("/hub/", "a b", "x/y") == "/hub/gpulab/runtime/a%20b/x%2Fy"


def project_spawner(user_options: dict, **settings):
    """A ProjectSpawner of a project that keeps ``user_options`` (no hub)."""
    from gpulab_hub.spawner import ProjectSpawner

    sp = ProjectSpawner(**settings)
    sp.user = SimpleNamespace(name="ann", groups=[], db=None)
    sp.orm_spawner = SimpleNamespace(
        name="lab", display_name="lab", server=None, user_options=user_options
    )
    return sp


def test_on_a_host_with_gpus_the_kept_choice_is_offered_first(monkeypatch):
    from faults_kit import inventory

    from gpulab_hub.gpus import spawner as gpu_spawner

    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inventory(2))
    types = ["H100", "A100"]
    sp = project_spawner({"gpus": 2, "gpu_type": "A100"}, gpu_allowed_types=types)
    choices = sp.gpu_choices()
    assert (choices.max_count, choices.default_count, choices.chosen_type) == (2, 2, "A100")
    runtime.check({"gpus": 2, "gpu_type": "A100"}, choices)
    with pytest.raises(options.OptionsError, match="at most 2 GPUs"):
        runtime.check({"gpus": 3}, choices)
    # the start form shows the kept choice selected, and sends it back as it is
    html = options.form(None, False, choices)
    assert '<option value="2" selected>2</option>' in html
    assert '<option value="A100" selected>A100</option>' in html
    # a project that never chose starts from the site's default (1 GPU), and CPU only
    # is a choice the host keeps (0 GPUs), not the site's default
    assert project_spawner({}).gpu_choices().default_count == 1
    assert project_spawner({"gpus": 0}).gpu_choices().default_count == 0
