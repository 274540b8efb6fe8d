"""jobs: indexes for the relay's scans that a long history made slow (bench/history.py,
docs/history.md): left checkpoints, queued and running jobs by deadline, waiting jobs
oldest first (priority aging)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

CHECKPOINTED = "checkpoint_step IS NOT NULL"
DEADLINE = "deadline_at IS NOT NULL AND status IN ('queued', 'running')"
WAITING = "status = 'queued' AND admitted_at IS NOT NULL"


def upgrade() -> None:
    op.create_index('ix_jobs_checkpointed', 'jobs', ['status'], unique=False, postgresql_where=sa.text(CHECKPOINTED), sqlite_where=sa.text(CHECKPOINTED))
    op.create_index('ix_jobs_deadline', 'jobs', ['deadline_at'], unique=False, postgresql_where=sa.text(DEADLINE), sqlite_where=sa.text(DEADLINE))
    op.create_index('ix_jobs_waiting', 'jobs', ['created_at', 'id'], unique=False, postgresql_where=sa.text(WAITING), sqlite_where=sa.text(WAITING))


def downgrade() -> None:
    op.drop_index('ix_jobs_waiting', table_name='jobs', postgresql_where=sa.text(WAITING), sqlite_where=sa.text(WAITING))
    op.drop_index('ix_jobs_deadline', table_name='jobs', postgresql_where=sa.text(DEADLINE), sqlite_where=sa.text(DEADLINE))
    op.drop_index('ix_jobs_checkpointed', table_name='jobs', postgresql_where=sa.text(CHECKPOINTED), sqlite_where=sa.text(CHECKPOINTED))
