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
    # kernels, Jupyter servers, nbconvert, job processes and the hub's services
    "tests/test_up_once.py",  # runs `gpulab up` (its start-up imports take seconds)
    "tests/test_db_hub.py",  # starts JupyterHub twice, runs `gpulab upgrade-db` twice
    "tests/test_db_postgres.py",  # starts a PostgreSQL server
    "tests/test_backup_postgres.py",  # starts a PostgreSQL server, runs pg_dump and pg_restore
    "tests/test_gpu_queue_spawn.py::test_twenty_waiting_starts_share_one_serve_a_tick_and_never_hold_the_docker_pool",  # noqa: E501
    "tests/test_jobs_local.py::test_a_job_outlives_the_kernel_that_started_it",
    "tests/test_jobs_local.py::test_a_notebook_job_writes_its_executed_copy_next_to_it",
    "tests/test_jobs_local.py::test_gpu_job_magic_in_a_kernel_that_then_dies",
    "tests/test_jobs_local.py::test_the_terminal_command",
    "tests/test_jobs_local.py::test_stop_ends_the_job_and_its_processes",
    "tests/test_jobs_commands.py::test_gpu_job_in_a_kernel_runs_commands_lists_with_headers_and_explains_no_gpu",
    "tests/test_jobs_commands.py::test_each_command_form_runs_for_real_with_its_words_untouched",
    "tests/test_gpu_status_api.py::test_processes_shape_with_a_running_kernel",
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
    "tests/test_cells_keep_room.py",  # a Jupyter server and a kernel, a 12-s cell
    "tests/test_cells_displays.py",  # a Jupyter server and kernels: displays, a bar, a widget
    "tests/test_cells_first_cell.py",  # a Jupyter server and two kernels
    "tests/test_gpu_keeper.py::test_the_keeper_service_stops_at_the_hubs_first_signal",
    "tests/test_cluster_batch_node.py",  # the node scripts run under bash, a recording docker
    "tests/test_cluster_multinode_units.py::test_a_failing_node_says_so_and_term_removes_the_container",
    "tests/test_compose.py",  # Debian's docker-compose reads compose.yml (1 s a run)
    "tests/test_auth_oidc_state.py",  # npm's oidc-provider (node) and the hub in-process
    # many processes, threads or connections at once
    "tests/test_faults_gpu_booking.py::test_spawns_never_double_book",
    "tests/test_allocator.py::test_processes_never_double_book",
    "tests/test_gpu_queue.py::test_processes_enqueueing_and_granting_at_once_lose_nothing_and_grant_nothing_twice",
    "tests/test_gpu_usage.py::test_processes_appending_at_once_lose_no_record",
    "tests/test_ssh_units.py::test_an_address_opens_at_most_ten_connections_not_logged_in_at_once",
    "tests/test_backup.py::test_the_database_is_copied_whole_while_the_hub_writes_to_it",
    # 68,000 files made, backed up and restored (about 40 s on a 2-core machine)
    "tests/test_backup_hostile.py::test_every_users_files_come_back_as_they_were",
    "tests/test_backup_hostile.py::test_the_sparse_file_is_restored_sparse_with_its_data",
    "tests/test_backup_hostile.py::test_the_backup_says_what_it_left_out_and_the_restore_which_links",
    # reads the hub's configuration as `gpulab backup` does (2 s)
    "tests/test_backup_hostile.py::test_a_project_over_the_admins_limit_is_named_and_the_rest_kept",
    "tests/test_state_versions.py::test_a_hub_start_meeting_a_newer_file_ends_with_the_sentence",
    "tests/test_state_versions.py::test_jupyterhubs_upgrade_db_runs_with_gpulabs_configuration",
    # hundreds of generated examples (hypothesis) of one policy
    "tests/test_allocator.py::test_choose_follows_the_rules_and_is_pure",
    "tests/test_allocator.py::test_store_sequences",
    "tests/test_gpu_reclaim.py::test_idle_release_takes_only_holders_idle_in_every_way_for_that_long",
    "tests/test_gpu_reclaim.py::test_a_job_or_a_busy_gpu_is_never_reclaimed_and_nothing_is_reclaimed_unneeded",
    "tests/test_gpu_reclaim_grants.py::test_every_planned_stop_is_followed_by_a_grant_that_uses_the_gpu_it_frees",
    "tests/test_magics_dockerfile.py::test_fuzz_lines_outside_the_block_are_untouched",
    # a wait that is the point of the test
    "tests/test_doctor_host.py::test_unreachable_engine_fails_fast",
    "tests/test_blocking.py::test_a_lock_held_elsewhere_ends_in_a_sentence_not_a_hang",
    "tests/test_gpu_status_api.py::test_sampler_survives_errors_says_stale_backs_off_and_recovers",
    "tests/test_gpu_queue_spawn.py::test_the_third_start_waits_says_its_place_and_starts_within_2s_of_a_release",
    "tests/test_gpu_queue_spawn.py::test_fair_share_serves_the_user_with_less_recent_gpu_time_first",
    "tests/test_cluster_spawner_units.py::test_poll_follows_the_job_and_stop_cancels_and_waits",
    "tests/test_cluster_down_units.py::test_down_waits_for_each_job_to_end_and_says_what_it_could_not_stop",
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
