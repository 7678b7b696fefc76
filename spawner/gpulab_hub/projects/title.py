"""A project's name as people know it: the display name its owner gave it
(JupyterHub's ``orm.Spawner.display_name``), else its short name (the server name,
``default`` for the default server). One function says it, for every page, the
container's environment and the Dockerfile's header; pages show it through the
template engine, which escapes it.
"""

from __future__ import annotations

from gpulab_hub.projects import DEFAULT_PROJECT
from gpulab_hub.projects.options import one_line


def title(orm_spawner) -> str:
    """The display name of a project (an ``orm.Spawner``, or a Spawner with one), else
    its short name; one line of printable characters."""
    found = getattr(orm_spawner, "orm_spawner", orm_spawner)
    display = getattr(found, "display_name", "") if found is not None else ""
    name = getattr(found if found is not None else orm_spawner, "name", "")
    return one_line(display or name or DEFAULT_PROJECT)


def page_titles(user):
    """``c.JupyterHub.template_vars`` entry: for the page's user, a function of
    (owner name, project name) giving that project's title (the short name when the
    hub knows no such project). Pages call it only for projects they already show."""

    def of(owner: str, project: str) -> str:
        from jupyterhub import orm

        name = "" if project == DEFAULT_PROJECT else project
        if user is None or not isinstance(owner, str) or not isinstance(name, str):
            return project
        found = orm.User.find(user.db, owner)
        spawner = found.orm_spawners.get(name) if found is not None else None
        return title(spawner) if spawner is not None else project

    return of


def configure(c) -> None:
    """In the hub's configuration (hubconfig.py): hub pages may name projects by title."""
    given = c.JupyterHub.template_vars if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**dict(given), "gpulab_project_title": page_titles}
