"""GPU spawn options, the admin view, and reservation on a host without GPUs."""

import pytest

from gpulab_hub import gpus
from gpulab_hub.cli import gpus as cli_gpus
from gpulab_hub.gpus import allocator
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.projects import objects, options


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"gpus": -1}, "between 0 and 64"),
        ({"gpus": 65}, "between 0 and 64"),
        ({"gpus": True}, "must be a int"),
        ({"gpus": "1"}, "must be a int"),
        ({"mig_profile": "1g.10gb; rm -rf /"}, "look like '1g.10gb'"),
        ({"gpu_type": "H100<script>"}, "GPU model name"),
        ({"image": "evil"}, "Unknown spawn option 'image'"),
        ({"extra_host_config": {"privileged": True}}, "Unknown spawn option"),
    ],
)
def test_untrusted_options_are_refused(bad, message):
    with pytest.raises(options.OptionsError, match=message):
        options.validate(bad)


def test_good_options_pass():
    ok = {"gpus": 2, "gpu_type": "H100", "mig_profile": "1g.10gb", "use_last_good": False}
    assert options.validate(ok) == ok


def test_form_offers_gpus_and_parses_back():
    html = options.form(None, False, options.GpuChoices(2, 1, ("H100",), ("1g.10gb",)))
    assert '<option value="1" selected>1</option>' in html
    assert '<option value="2">2</option>' in html and 'value="3"' not in html
    assert '<option value="H100">H100</option>' in html
    assert "MIG slice 1g.10gb" in html
    assert options.from_form({"gpus": ["2"], "gpu_type": ["H100"], "mig_profile": [""]}) == {
        "gpus": 2,
        "gpu_type": "H100",
    }
    with pytest.raises(options.OptionsError):
        options.from_form({"gpus": ["two"]})


def test_no_form_on_a_cpu_host_without_a_failed_build():
    assert options.form(None, False, None) == ""
    assert "Start the last image" in options.form("gpulab/project:abc", True, None)


H100 = gpus.Device("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * 2**30, "9.0", minor=0)
A100 = gpus.Device("1", "GPU-bbbb", "NVIDIA A100-SXM4-80GB", 80 * 2**30, "8.0", minor=1)


def test_admin_view_names_who_holds_what():
    inv = gpus.Inventory([H100, A100], driver="580.159.04", cuda="13.0")
    held = {"GPU-aaaa": (allocator.Holder("alice", "vision", 0.0),)}
    lines = cli_gpus.report(inv, held)
    assert lines[0] == "NVIDIA driver 580.159.04, CUDA 13.0"
    assert lines[1].startswith("  GPU 0: NVIDIA H100 80GB HBM3, 80 GiB, compute 9.0 (GPU-aaaa): ")
    assert "alice/vision since 1970-01-01" in lines[1]
    assert lines[2].endswith("(GPU-bbbb): free")


def test_no_gpu_host_refuses_gpu_requests_and_runs_cpu_projects(tmp_path):
    """For real: this machine has no NVIDIA driver."""
    s = gpu_spawner.GpuTraits(allocations_file=str(tmp_path / "alloc.json"))
    assert not gpus.inventory().devices
    cpu, devices = gpu_spawner.reserve(s, None, "gpulab", allocator.Request("alice", "p", 0))
    assert cpu == objects.GpuAssignment() and devices == []
    with pytest.raises(allocator.AllocationError, match="asks for 1 GPU.*no NVIDIA driver"):
        gpu_spawner.reserve(s, None, "gpulab", allocator.Request("alice", "p", 1))
    assert allocator.AllocationStore(tmp_path / "alloc.json").holdings() == {}


def test_admin_view_lists_the_waiting_starts_in_serving_order():
    from gpulab_hub.gpus import allocator
    from gpulab_hub.gpus.queue import Entry

    now = 10_000.0
    ranked = [
        Entry(allocator.Request("carol", "fit", 1), now - 600),
        Entry(allocator.Request("dave", "eval", 2, gpu_type="h100"), now - 60),
    ]
    lines = cli_gpus.waiting_lines(ranked, {"carol": 1.5, "dave": 30.0}, frozenset({"dave"}), now)
    assert lines == [
        "Waiting for a GPU, in the order they will be served:",
        "  1. carol/fit: 1 GPU(s), waiting 10 min (1.5 GPU-h in the window)",
        "  2. dave/eval: 2 GPU(s) of type h100, waiting 1 min (30.0 GPU-h in the window, "
        "over budget)",
    ]
    assert cli_gpus.waiting_lines([], {}, frozenset(), now) == ["Nobody waits for a GPU."]
