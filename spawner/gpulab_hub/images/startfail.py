"""Why a project did not start, as the person starting it is told.

JupyterHub shows a failed start in three places: the answer to the start request
itself, the spawn page's progress (its last event), and the page that page reloads
to (``not_running.html``, from JupyterHub's spawn-pending handler). :class:`SpawnError`
is JupyterHub's own SpawnException (an HTTP error with a plain and an HTML message),
so each place shows the same reason, the end of the build log and a link to the whole
log; gpulab's templates (projects/templates/) read its ``gpulab_*`` attributes to
offer the choices: build the Dockerfile again, or start the last image that built.

ProjectSpawner.start keeps a failed start pending for at least
:data:`MIN_FAILURE_S`: JupyterHub's spawn page answers a start that fails within
its first second with a bare error page, one that takes longer with the spawn page,
where the reason shows (docs/projects.md).
"""

from __future__ import annotations

from html import escape

from jupyterhub.spawner import SpawnException

from gpulab_hub.images.project import plain_text

# JupyterHub's SpawnHandler waits 1 s for a start before sending the browser to the
# spawn page; a failure sooner than that becomes a bare "500: Unhandled error".
MIN_FAILURE_S = 1.5
TAIL_HEADING = "Last lines of the build log:"


class SpawnError(SpawnException):
    """A failed start, with what the spawn pages show.

    ``message``: the reason and what to do, one paragraph of plain text.
    ``log_tail``: the last lines of a failed build; ``log_url``: the hub page with
    the whole log; ``last_good``: the description of the last image that built,
    offered as a choice when the build failed. ``reason``: a short label for
    JupyterHub's metrics (never "error" or "timeout", which JupyterHub words itself).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "refused",
        status_code: int = 400,
        log_tail: list[str] | tuple[str, ...] = (),
        log_url: str = "",
        last_good: str = "",
        build_failed: bool = False,
    ):
        tail = "\n".join(plain_text(line).rstrip("\n") for line in log_tail)
        text = message
        html = f'<p class="gpulab-reason">{escape(message)}</p>'
        if tail:
            text += f"\n{TAIL_HEADING}\n{tail}"
            html += f'<p>{TAIL_HEADING}</p><pre class="gpulab-log-tail">{escape(tail)}</pre>'
        if log_url:
            text += f"\nThe whole build log: {log_url}"
            html += (
                f'<p><a class="gpulab-build-log-link" href="{escape(log_url)}">'
                "Open the whole build log</a></p>"
            )
        super().__init__(
            message, reason=reason, message_html=html, status_code=status_code, log_message=text
        )
        # What JupyterHub shows: its progress events, REST answers and pages read these.
        self.jupyterhub_message = text
        self.jupyterhub_html_message = html
        self.gpulab_build_failed = build_failed
        self.gpulab_last_good = last_good if build_failed else ""
        self.gpulab_log_url = log_url

    def __str__(self) -> str:
        """The reason in words (JupyterHub's "422 SpawnError(reason=build): ..." is for
        logs; pages that show ``str()`` of a failed start, as gpulab's home page does,
        show this)."""
        return self.message


def build_failed(
    project: str, last_good: str, log_tail, log_url: str, limit: str = ""
) -> SpawnError:
    """The Dockerfile of ``project`` did not build; ``last_good`` describes the last
    image that built ("" when there is none); ``limit``: the build limit that stopped it,
    in the user's words ("" when a step failed by itself)."""
    message = f"The Dockerfile of project {project} failed to build, so the project did not start."
    if limit:
        message += " " + limit
    if last_good:
        message += (
            f" The last image that built ({last_good}) is kept: start it to fix the "
            "Dockerfile from inside the project, or fix the Dockerfile and build it again."
        )
    else:
        message += (
            " Fix the Dockerfile (the build log shows which step failed), then start "
            "the project again."
        )
    return SpawnError(
        message,
        reason="build",
        status_code=422,
        log_tail=log_tail,
        log_url=log_url,
        last_good=last_good,
        build_failed=True,
    )
