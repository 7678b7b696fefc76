"""gpulab's tables: one source of truth for their shape (the migrations make them;
tests/test_db.py checks the migrated database against these definitions).

Every name starts with ``gpulab_`` so it never meets one of JupyterHub's. JupyterHub's
``users`` table is named only as the target of foreign keys (``USERS``: the two columns
gpulab reads), never created or changed here.
"""

from __future__ import annotations

import sqlalchemy as sa

PREFIX = "gpulab_"
# gpulab's Alembic revision (JupyterHub keeps its own in alembic_version)
VERSION_TABLE = "gpulab_alembic_version"
NAME_LEN = 128  # user, project, GPU UUID and label: gpus/usage.py's patterns allow 128

METADATA = sa.MetaData()


def project_key() -> sa.Column:
    """The key of a table with one row a project: JupyterHub's server row, by foreign
    key (ON DELETE CASCADE: the row goes with the project and with its owner; a rename
    renames the server row in place, so the row follows it: records.ByServerRow)."""
    return sa.Column(
        "server_id",
        sa.Integer,
        sa.ForeignKey("spawners.id", ondelete="CASCADE"),
        primary_key=True,
    )


# JupyterHub's users (jupyterhub/orm.py: User), as far as gpulab reads them: a
# lightweight clause, not part of METADATA, so nothing of gpulab's ever makes or alters it.
USERS = sa.table("users", sa.column("id", sa.Integer), sa.column("name", sa.Unicode))
# JupyterHub's servers (jupyterhub/orm.py: Spawner, a user's named server is a project),
# as far as gpulab reads them, in the same way.
SPAWNERS = sa.table(
    "spawners",
    sa.column("id", sa.Integer),
    sa.column("user_id", sa.Integer),
    sa.column("name", sa.Unicode),
)

# GPU holdings that ended (gpus/usage.py): one row a device a holding.
usage = sa.Table(
    "gpulab_usage",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # the JupyterHub user (deleting the user deletes their rows); NULL only for a
    # record imported from a ledger file whose user the hub no longer has
    sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id", ondelete="CASCADE")),
    sa.Column("owner", sa.Unicode(NAME_LEN), nullable=False),  # the user's name then
    sa.Column("project", sa.Unicode(NAME_LEN), nullable=False),
    sa.Column("uuid", sa.Unicode(NAME_LEN), nullable=False),
    sa.Column("label", sa.Unicode(NAME_LEN), nullable=False),
    sa.Column("started", sa.Float, nullable=False),  # epoch seconds
    sa.Column("ended", sa.Float, nullable=False),
    sa.Column("util", sa.Float),  # average utilisation, percent; NULL: not measured
    sa.Index("gpulab_usage_ended", "ended"),
    sa.Index("gpulab_usage_owner_ended", "owner", "ended"),
    sa.Index("gpulab_usage_user_id", "user_id"),
)

# Files of gpulab before its database, imported into the tables once (migrate.py): the
# import and this row commit together, so a file is never imported twice.
imports = sa.Table(
    "gpulab_imports",
    METADATA,
    sa.Column("name", sa.Unicode(64), primary_key=True),  # "gpu-usage"
    sa.Column("source", sa.Unicode(4096), nullable=False),  # the file's path then
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("skipped", sa.Integer, nullable=False),  # damaged or torn lines
    sa.Column("at", sa.Float, nullable=False),  # epoch seconds
)

# Workflows under way that change a project in several places (workflows/journal.py): a
# rename or a deletion, written before its first step and removed after its last, so a
# hub that died in between finishes it as it starts. The row names JupyterHub's server
# row by foreign key: deleting the server (the deletion's last step, JupyterHub's) or
# its user deletes the row with it, in the same transaction.
workflows = sa.Table(
    "gpulab_workflows",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "server_id",
        sa.Integer,
        sa.ForeignKey("spawners.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,  # one workflow a project at a time
    ),
    sa.Column("kind", sa.Unicode(16), nullable=False),  # "rename" or "delete"
    sa.Column("owner", sa.Unicode(NAME_LEN), nullable=False),
    sa.Column("project", sa.Unicode(NAME_LEN), nullable=False),  # the name it had
    sa.Column("new_name", sa.Unicode(NAME_LEN)),  # rename: the name it gets
    sa.Column("display_name", sa.UnicodeText),  # rename: the display name it gets
    sa.Column("place", sa.UnicodeText, nullable=False),  # JSON: the hub's folders it touches
    sa.Column("started", sa.Float, nullable=False),  # epoch seconds
)

# Each user's secrets (secrets/store.py): the value only as JupyterHub's CryptKeeper
# encrypted it. Deleting the user deletes them.
secrets = sa.Table(
    "gpulab_secrets",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("name", sa.Unicode(64), nullable=False),  # secrets/names.py's NAME
    sa.Column("value", sa.UnicodeText, nullable=False),  # a Fernet token, never plaintext
    sa.Column("set_at", sa.Unicode(32), nullable=False),  # ISO 8601, UTC
    sa.UniqueConstraint("user_id", "name", name="gpulab_secrets_user_name"),
)

# A project's choice of its owner's secrets, one row a project that has one: named by
# JupyterHub's server row, so it follows a rename (the row is renamed in place) and goes
# with the project's deletion or its owner's, in the database itself.
secret_choices = sa.Table(
    "gpulab_secret_choices",
    METADATA,
    project_key(),
    # collaborators' kernels, terminals and jobs get them too
    sa.Column("collaborators", sa.Boolean, nullable=False),
)

# The secrets a choice names: deleting a secret takes it out of every choice.
secret_chosen = sa.Table(
    "gpulab_secret_chosen",
    METADATA,
    sa.Column(
        "server_id",
        sa.Integer,
        sa.ForeignKey("gpulab_secret_choices.server_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column(
        "secret_id",
        sa.Integer,
        sa.ForeignKey("gpulab_secrets.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Index("gpulab_secret_chosen_secret_id", "secret_id"),
)

# Each account's login identity at its provider (accounts/identities.py): bound at the
# account's first login, before JupyterHub makes its user row, so named by the account's
# name (JupyterHub's user names are unique) rather than by foreign key; an account's
# deletion removes it (accounts/records.py).
login_identities = sa.Table(
    "gpulab_login_identities",
    METADATA,
    sa.Column("name", sa.Unicode(NAME_LEN), primary_key=True),
    sa.Column("provider", sa.UnicodeText, nullable=False),  # "oidc <issuer>", "ldap", "github"
    sa.Column("subject", sa.UnicodeText, nullable=False),  # the provider's id of the person
    sa.Column("since", sa.Float, nullable=False),  # epoch seconds
)

# What an owner allows the people a project is shared with (sharing/policy.py), one row a
# project whose owner changed it: JupyterHub's server row by foreign key, so it follows a
# rename and goes with the project or its owner.
sharing_settings = sa.Table(
    "gpulab_sharing_settings",
    METADATA,
    project_key(),
    sa.Column("collaborators_may_start", sa.Boolean, nullable=False),
    sa.Column("collaborators_may_reshare", sa.Boolean, nullable=False),
)
