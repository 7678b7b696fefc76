"""Each account's login identity at its provider (before: login-identities.json).

Revision ID: 0004_login_identities
Revises: 0003_secrets
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_login_identities"
down_revision = "0003_secrets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_login_identities",
        sa.Column("name", sa.Unicode(128), primary_key=True),
        sa.Column("provider", sa.UnicodeText, nullable=False),
        sa.Column("subject", sa.UnicodeText, nullable=False),
        sa.Column("since", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpulab_login_identities")
