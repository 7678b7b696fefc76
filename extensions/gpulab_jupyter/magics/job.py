"""``%gpu_job``: jobs from a notebook, with the words of ``gpulab-job`` (jobs/cli.py).

``%gpu_job run train.py --epochs 3`` starts the script as a job in this project's
container, ``%gpu_job run -- accelerate launch train.py`` any command: it keeps running
when the tab closes, the kernel restarts or the network drops. What the magic shows is
saved with the notebook as HTML and plain text.
"""

from __future__ import annotations

import html
import shlex

from gpulab_jupyter.jobs.model import JobError, JobRecord


def _show(text: str, rich: str) -> None:
    from IPython.display import display

    display({"text/plain": text, "text/html": rich}, raw=True)


def _row(r: JobRecord) -> tuple[str, str]:
    from gpulab_jupyter.jobs.cli import describe

    line = describe(r)
    return line, f"<code>{html.escape(line)}</code>"


def _table(records: list[JobRecord]) -> tuple[str, str]:
    """``%gpu_job list``: the terminal's table as text, an HTML table with headers."""
    from gpulab_jupyter.jobs.cli import HEADER, columns, table

    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in HEADER)
    rows = "".join(
        "<tr>" + "".join(f"<td><code>{html.escape(c)}</code></td>" for c in columns(r)) + "</tr>"
        for r in records
    )
    rich = f"<table class='gpulab-jobs'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    return "\n".join(table(records)), rich


def gpu_job(line: str, engine=None) -> None:
    from gpulab_jupyter.jobs import cli
    from gpulab_jupyter.jobs.cluster import engine_for

    try:
        words = shlex.split(line)
    except ValueError as e:
        raise JobError(f"%gpu_job: {e}") from None
    args = cli.parse(words, "%gpu_job", raise_errors=True)
    engine = engine or engine_for(cli.project_dir())
    if args.command == "run":
        record = engine.start(cli.request(args))
        text = (
            f"Started job {record.id} ({record.state}). It keeps running when you close "
            f"this tab. Output: jobs/{record.id}/output.log. "
            f"See it with %gpu_job logs {record.id}; stop it with %gpu_job stop {record.id}."
        )
        if record.output:
            text += f" The executed notebook will be {record.output}."
        _show(text, f"<p>{html.escape(text)}</p>")
        if args.follow:
            record = cli.follow(engine, record.id)
            _show(*_row(record))
        return
    if args.command == "list":
        records = engine.list()
        if not records:
            _show("No jobs in this project yet.", "<p>No jobs in this project yet.</p>")
            return
        _show(*_table(records))
        return
    if args.command == "logs":
        if args.follow:
            cli.follow(engine, args.id)
        else:
            print(engine.logs(args.id), end="")
        return
    action = {"status": engine.status, "stop": engine.stop, "rerun": engine.rerun}
    _show(*_row(action[args.command](args.id)))
