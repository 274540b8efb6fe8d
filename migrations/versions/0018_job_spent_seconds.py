"""jobs.spent_seconds: running seconds a job's earlier deliveries spent (its time budget
across deliveries)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        'jobs',
        sa.Column('spent_seconds', sa.Float(), nullable=False, server_default=sa.text('0')),
    )


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('spent_seconds')
