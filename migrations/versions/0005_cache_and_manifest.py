"""result cache key and source, reproducibility manifest, replays; model weight digests

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

CACHE_WHERE = "status = 'succeeded' AND data_removed_at IS NULL AND cache_key IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        'model_digests',
        sa.Column('model', sa.String(length=100), nullable=False),
        sa.Column('digest', sa.String(length=64), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('model'),
    )
    op.add_column('jobs', sa.Column('cache_key', sa.String(length=64), nullable=True))
    op.add_column('jobs', sa.Column('cached_from', sa.Uuid(), nullable=True))
    op.add_column('jobs', sa.Column('replay_of', sa.Uuid(), nullable=True))
    op.add_column('jobs', sa.Column('manifest', sa.JSON().with_variant(sa.dialects.postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True))
    op.create_index('ix_jobs_cache', 'jobs', ['tenant_id', 'cache_key', 'finished_at'], unique=False, postgresql_where=sa.text(CACHE_WHERE), sqlite_where=sa.text(CACHE_WHERE))
    op.create_index('ix_jobs_cached_from', 'jobs', ['cached_from'], unique=False, postgresql_where=sa.text("cached_from IS NOT NULL"), sqlite_where=sa.text("cached_from IS NOT NULL"))


def downgrade() -> None:
    op.drop_index('ix_jobs_cached_from', table_name='jobs', postgresql_where=sa.text("cached_from IS NOT NULL"), sqlite_where=sa.text("cached_from IS NOT NULL"))
    op.drop_index('ix_jobs_cache', table_name='jobs', postgresql_where=sa.text(CACHE_WHERE), sqlite_where=sa.text(CACHE_WHERE))
    op.drop_column('jobs', 'manifest')
    op.drop_column('jobs', 'replay_of')
    op.drop_column('jobs', 'cached_from')
    op.drop_column('jobs', 'cache_key')
    op.drop_table('model_digests')
