"""gpulab's first tables: the GPU usage ledger and the record of imported files.

Revision ID: 0001_usage
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_usage"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_usage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.Integer),
        sa.Column("owner", sa.Unicode(128), nullable=False),
        sa.Column("project", sa.Unicode(128), nullable=False),
        sa.Column("uuid", sa.Unicode(128), nullable=False),
        sa.Column("label", sa.Unicode(128), nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("ended", sa.Float, nullable=False),
        sa.Column("util", sa.Float),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
    )
    op.create_index("gpulab_usage_ended", "gpulab_usage", ["ended"])
    op.create_index("gpulab_usage_owner_ended", "gpulab_usage", ["owner", "ended"])
    op.create_index("gpulab_usage_user_id", "gpulab_usage", ["user_id"])
    op.create_table(
        "gpulab_imports",
        sa.Column("name", sa.Unicode(64), primary_key=True),
        sa.Column("source", sa.Unicode(4096), nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("skipped", sa.Integer, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpulab_imports")
    op.drop_index("gpulab_usage_user_id", "gpulab_usage")
    op.drop_index("gpulab_usage_owner_ended", "gpulab_usage")
    op.drop_index("gpulab_usage_ended", "gpulab_usage")
    op.drop_table("gpulab_usage")
