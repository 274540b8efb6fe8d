"""queue order and estimates, versions, idempotency keys, deadlines

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('publish_priority', sa.SmallInteger(), server_default=sa.text('5'), nullable=False))
    op.add_column('jobs', sa.Column('work_units', sa.Integer(), server_default=sa.text('1'), nullable=False))
    op.add_column('jobs', sa.Column('version', sa.Integer(), server_default=sa.text('0'), nullable=False))
    op.add_column('jobs', sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('jobs', sa.Column('idempotency_key', sa.String(length=255), nullable=True))
    op.add_column('jobs', sa.Column('request_hash', sa.String(length=64), nullable=True))
    # Existing rows: derive the new columns from what they already say.
    if op.get_bind().dialect.name == "postgresql":
        units = "COALESCE((input->>'steps')::int, 1) * COALESCE((input->>'num_images')::int, 1)"
        op.execute(f"UPDATE jobs SET work_units = GREATEST(1, {units})")
    else:
        units = "COALESCE(json_extract(input, '$.steps'), 1) * COALESCE(json_extract(input, '$.num_images'), 1)"
        op.execute(f"UPDATE jobs SET work_units = MAX(1, {units})")
    op.execute("UPDATE jobs SET publish_priority = CASE priority WHEN 'low' THEN 1 WHEN 'high' THEN 9 ELSE 5 END")
    op.create_index('ix_jobs_model_finished', 'jobs', ['model', 'finished_at'], unique=False, postgresql_where=sa.text("status = 'succeeded'"), sqlite_where=sa.text("status = 'succeeded'"))
    op.create_index('ix_jobs_queued_order', 'jobs', ['queue', 'publish_priority', 'id'], unique=False, postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))
    op.create_index('ix_jobs_running', 'jobs', ['queue'], unique=False, postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
    op.create_index('uq_jobs_tenant_id_idempotency_key', 'jobs', ['tenant_id', 'idempotency_key'], unique=True)


def downgrade() -> None:
    op.drop_index('uq_jobs_tenant_id_idempotency_key', table_name='jobs')
    op.drop_index('ix_jobs_running', table_name='jobs', postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
    op.drop_index('ix_jobs_queued_order', table_name='jobs', postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))
    op.drop_index('ix_jobs_model_finished', table_name='jobs', postgresql_where=sa.text("status = 'succeeded'"), sqlite_where=sa.text("status = 'succeeded'"))
    op.drop_column('jobs', 'request_hash')
    op.drop_column('jobs', 'idempotency_key')
    op.drop_column('jobs', 'deadline_at')
    op.drop_column('jobs', 'version')
    op.drop_column('jobs', 'work_units')
    op.drop_column('jobs', 'publish_priority')
