"""What an owner allows the people a project is shared with (before: sharing.json).

Revision ID: 0005_sharing_settings
Revises: 0004_login_identities
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_sharing_settings"
down_revision = "0004_login_identities"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_sharing_settings",
        sa.Column("server_id", sa.Integer, primary_key=True),
        sa.Column("collaborators_may_start", sa.Boolean, nullable=False),
        sa.Column("collaborators_may_reshare", sa.Boolean, nullable=False),
        sa.ForeignKeyConstraint(["server_id"], ["spawners.id"], ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("gpulab_sharing_settings")
