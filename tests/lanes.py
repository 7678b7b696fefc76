"""The test lanes (docs/testing.md): which tests need what, as pytest markers.

``make test`` runs every test (CI's whole truth). ``make test-fast`` runs those marked
none of ``docker``, ``browser``, ``gpu`` and ``slow``: no Docker engine, no hub start, no
kernels, under 2 minutes on a 2-core machine. This plugin (conftest.py loads it) marks:

- ``docker`` every test that asks for a fixture that needs the Docker engine (the hub,
  the second hub, the test cluster, the local Debian image), whether or not its module
  says so, so that no such test ever runs in the fast lane;
- ``browser`` every test that asks for the ``browser`` fixture;
- ``slow`` the tests listed in :data:`SLOW`: each takes seconds because it starts
  processes (kernels, Jupyter servers, pip builds, services, many writers at once) or
  waits out a timeout. A test that takes a second or more on an idle machine belongs
  here; the fast lane's slowest durations (``--durations``) show new ones.
"""

from __future__ import annotations

import pytest

# Fixtures (tests/conftest.py) and the marker a test that asks for one gets.
NEEDS = {
    "docker_engine": "docker",
    "hub": "docker",
    "second_hub": "docker",
    "shared_cluster": "docker",
    "local_debian": "docker",
    "show_logs_on_failure": "docker",
    "browser": "browser",
}

# Node ids (a module, or a module's test: every parametrisation of it) marked `slow`.
SLOW = (
    # pip builds and installs
    "tests/test_wheels.py",  # builds both distributions' wheels, installs them in a venv
    "tests/test_magics_kernel.py",  # a real IPython kernel installing from a wheelhouse
    "tests/test_magics_concurrent.py",  # twenty pip installs at once
    "tests/test_magics_dockerfile.py::test_concurrent_writers_from_separate_processes_lose_nothing",
    # kernels, Jupyter servers, nbconvert and the hub's services as processes
    "tests/test_jobs_local.py::test_a_job_outlives_the_kernel_that_started_it",
    "tests/test_jobs_local.py::test_a_notebook_job_writes_its_executed_copy_next_to_it",
    "tests/test_jobs_local.py::test_gpu_job_magic_in_a_kernel_that_then_dies",
    "tests/test_jobs_local.py::test_the_terminal_command",
    "tests/test_hub_peers.py::test_a_stranger_is_refused_everything_and_loopback_is_not",
    "tests/test_hub_peers.py::test_the_hubs_address_is_answered",
    "tests/test_hub_peers.py::test_a_value_that_is_no_address_list_lets_loopback_only",
    "tests/test_hub_peers.py::test_without_the_variable_nothing_changes",
    "tests/test_public_render.py::test_a_render_that_runs_over_its_time_is_killed",
    "tests/test_public_render.py::test_render_gives_sanitized_html_or_says_not_a_notebook",
    "tests/test_public_render.py::test_views_of_one_version_share_one_render_then_hit_the_cache",
    "tests/test_faults_pidfile.py::test_gpulab_down_leaves_an_unrelated_process_alone",
    "tests/test_faults_pidfile.py::test_gpulab_down_stops_the_process_it_recorded",
    "tests/test_culling.py::test_the_culler_service_stops_at_the_hubs_first_signal",
    "tests/test_gpu_keeper.py::test_the_keeper_service_stops_at_the_hubs_first_signal",
    "tests/test_compose.py",  # Debian's docker-compose reads compose.yml (1 s a run)
    # many processes at once, or a wait that is the point of the test
    "tests/test_faults_gpu_booking.py::test_spawns_never_double_book",
    "tests/test_doctor_host.py::test_unreachable_engine_fails_fast",
    "tests/test_gpu_status_api.py::test_sampler_survives_errors_says_stale_backs_off_and_recovers",
    "tests/test_gpu_queue_spawn.py::test_the_third_start_waits_says_its_place_and_starts_within_2s_of_a_release",
    "tests/test_gpu_queue_spawn.py::test_fair_share_serves_the_user_with_less_recent_gpu_time_first",
)


def _listed(nodeid: str) -> str | None:
    for entry in SLOW:
        if nodeid == entry or nodeid.startswith((entry + "::", entry + "[")):
            return entry
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark each test by what it needs (before ``-m`` selects)."""
    used = set()
    for item in items:
        for fixture, marker in NEEDS.items():
            if fixture in item.fixturenames and marker not in item.keywords:
                item.add_marker(marker)
        entry = _listed(item.nodeid)
        if entry is not None:
            used.add(entry)
            item.add_marker(pytest.mark.slow)
    # A listed test that the whole suite no longer has (renamed?) is said at the end.
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        config._gpulab_stale_slow = [e for e in SLOW if e not in used]


def pytest_terminal_summary(terminalreporter, config):
    stale = getattr(config, "_gpulab_stale_slow", [])
    if stale:
        terminalreporter.write_line(
            "tests/lanes.py: SLOW names tests that no longer exist (renamed?): " + ", ".join(stale),
            yellow=True,
        )
