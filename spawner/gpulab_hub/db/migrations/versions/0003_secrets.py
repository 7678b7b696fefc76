"""Users' secrets and their projects' choices of them (before: secrets/<user>.json).

Revision ID: 0003_secrets
Revises: 0002_workflows
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_secrets"
down_revision = "0002_workflows"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_secrets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.Integer, nullable=False),
        sa.Column("name", sa.Unicode(64), nullable=False),
        sa.Column("value", sa.UnicodeText, nullable=False),
        sa.Column("set_at", sa.Unicode(32), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("user_id", "name", name="gpulab_secrets_user_name"),
    )
    op.create_table(
        "gpulab_secret_choices",
        sa.Column("server_id", sa.Integer, primary_key=True),
        sa.Column("collaborators", sa.Boolean, nullable=False),
        sa.ForeignKeyConstraint(["server_id"], ["spawners.id"], ondelete="CASCADE"),
    )
    op.create_table(
        "gpulab_secret_chosen",
        sa.Column("server_id", sa.Integer, primary_key=True),
        sa.Column("secret_id", sa.Integer, primary_key=True),
        sa.ForeignKeyConstraint(
            ["server_id"], ["gpulab_secret_choices.server_id"], ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["secret_id"], ["gpulab_secrets.id"], ondelete="CASCADE"),
    )
    op.create_index("gpulab_secret_chosen_secret_id", "gpulab_secret_chosen", ["secret_id"])


def downgrade() -> None:
    op.drop_table("gpulab_secret_chosen")
    op.drop_table("gpulab_secret_choices")
    op.drop_table("gpulab_secrets")
