"""finished jobs by finish time (job retention's purge)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

WHERE = "status IN ('succeeded', 'failed', 'canceled')"


def upgrade() -> None:
    op.create_index('ix_jobs_finished', 'jobs', ['finished_at'], unique=False, postgresql_where=sa.text(WHERE), sqlite_where=sa.text(WHERE))


def downgrade() -> None:
    op.drop_index('ix_jobs_finished', table_name='jobs', postgresql_where=sa.text(WHERE), sqlite_where=sa.text(WHERE))
