"""``gpulab doctor``: the subcommand's options and what it prints."""

from __future__ import annotations

import shutil
import sys

from gpulab_hub import hubsettings
from gpulab_hub.cluster import ClusterError
from gpulab_hub.doctor import PAGE, cluster
from gpulab_hub.doctor.findings import exit_code, render_table, to_json
from gpulab_hub.doctor.report import Options, report_path, run, save

HELP = "check this host (and a project) for the GPU, Docker, memory and disk traps"
EPILOG = """exit code: 0 when nothing failed (warnings are printed), 1 when a check failed;
with --strict, warnings give 1 too. A host without a GPU warns about it (a hub can run
CPU-only); say it is meant to be so with --cpu-only to turn those warnings into ok.
On a Slurm cluster (the hub's spawner is ProjectSlurmSpawner) it checks the cluster
too, with a short job on each idle node (docs/cluster.md, "Checking the cluster")."""


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help=HELP, description=HELP + ".", epilog=EPILOG)
    p.add_argument(
        "--json", action="store_true", help='print a JSON list of {"id", "status", "seen", "fix"}'
    )
    p.add_argument(
        "--project",
        metavar="USER/PROJECT",
        help="also check inside this project's container (or a throwaway one of "
        "its image when it is not running)",
    )
    p.add_argument(
        "--cpu-only",
        action="store_true",
        help="this host is meant to have no GPU: no GPU is ok, not a warning",
    )
    p.add_argument(
        "--image",
        help="image for the GPU test container (default: the first "
        "image in use with a python3, the base image first)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on warnings too, not only on failures (for monitoring)",
    )
    p.add_argument(
        "--no-probe-jobs",
        dest="probe_jobs",
        action="store_false",
        help="on a Slurm cluster: check the controller, nodes and registry only, "
        "submitting no probe job to the nodes",
    )
    p.add_argument(
        "--print-epilog",
        action="store_true",
        help="on a Slurm cluster: print the Epilog gpulab needs on every node (for "
        "these settings) and exit",
    )
    p.set_defaults(fn=cmd_doctor)


def print_epilog() -> int:
    """The cluster's Epilog for this hub's settings, on standard output."""
    spawner = hubsettings.spawner_of(hubsettings.read_config(hubsettings.config_file()))
    settings = cluster.settings_of(spawner)
    if settings is None:
        print(
            "This hub runs projects on this machine, not on a Slurm cluster: no Epilog "
            "to print (docs/cluster.md says how to set up the cluster).",
            file=sys.stderr,
        )
        return 2
    try:
        print(cluster.expected_epilog(settings), end="")
    except ClusterError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_doctor(args, environ) -> int:
    if args.print_epilog:
        return print_epilog()
    opts = Options(
        project=args.project, cpu_only=args.cpu_only, image=args.image, probe_jobs=args.probe_jobs
    )
    findings, report = run(environ, opts)
    path = report_path(hubsettings.load(hubsettings.config_file()))
    note = f"Report saved to {path}; admins see it at /hub{PAGE} on the hub."
    try:
        save(report, path)
    except OSError as e:
        note = f"(could not save the report to {path}: {e})"
    if args.json:
        print(to_json(findings))
        print(note, file=sys.stderr)
    else:
        color = sys.stdout.isatty() and not environ.get("NO_COLOR")
        width = shutil.get_terminal_size((110, 24)).columns
        print(render_table(findings, color=color, width=width))
        print(note)
    return exit_code(findings, strict=args.strict)
