"""Workflows under way (a project's rename or deletion), finished after a crash.

Revision ID: 0002_workflows
Revises: 0001_usage
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_workflows"
down_revision = "0001_usage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_workflows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("server_id", sa.Integer, nullable=False),
        sa.Column("kind", sa.Unicode(16), nullable=False),
        sa.Column("owner", sa.Unicode(128), nullable=False),
        sa.Column("project", sa.Unicode(128), nullable=False),
        sa.Column("new_name", sa.Unicode(128)),
        sa.Column("display_name", sa.UnicodeText),
        sa.Column("place", sa.UnicodeText, nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.ForeignKeyConstraint(["server_id"], ["spawners.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("server_id"),
    )


def downgrade() -> None:
    op.drop_table("gpulab_workflows")
