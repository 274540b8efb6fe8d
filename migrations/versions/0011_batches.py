"""batches: many jobs submitted as one, their files, and their completion webhooks

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def _json():
    return sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    op.create_table(
        'batches',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('endpoint', sa.String(length=64), nullable=False),
        sa.Column('input_file_id', sa.Uuid(), nullable=True),
        sa.Column('completion_window', sa.String(length=16), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('in_progress_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cancelling_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finalizing_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('total', sa.Integer(), nullable=False),
        sa.Column('invalid', sa.Integer(), nullable=False),
        sa.Column('expired', sa.Integer(), nullable=False),
        sa.Column('counts', _json(), nullable=True),
        sa.Column('output_file_id', sa.Uuid(), nullable=True),
        sa.Column('error_file_id', sa.Uuid(), nullable=True),
        sa.Column('errors', _json(), nullable=True),
        sa.Column('invalid_lines', _json(), nullable=True),
        sa.Column('b64_json', _json(), nullable=True),
        sa.Column('metadata', _json(), nullable=True),
        sa.Column('webhook_url', sa.Text(), nullable=True),
        sa.Column('idempotency_key', sa.String(length=255), nullable=True),
        sa.Column('request_hash', sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_batches_tenant_id_id', 'batches', ['tenant_id', 'id'], unique=False)
    op.create_index(
        'uq_batches_tenant_id_idempotency_key',
        'batches',
        ['tenant_id', 'idempotency_key'],
        unique=True,
    )
    op.create_index(
        'ix_batches_open',
        'batches',
        ['id'],
        unique=False,
        postgresql_where=sa.text('finished_at IS NULL'),
        sqlite_where=sa.text('finished_at IS NULL'),
    )
    op.create_table(
        'files',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('purpose', sa.String(length=32), nullable=False),
        sa.Column('filename', sa.String(length=255), nullable=False),
        sa.Column('bytes', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('storage_key', sa.Text(), nullable=True),
        sa.Column('batch_id', sa.Uuid(), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_files_tenant_id_id', 'files', ['tenant_id', 'id'], unique=False)
    # No foreign key from jobs to batches: a reference check per inserted job would be a
    # trigger per row on the hottest insert; the batch's purge removes its jobs.
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('batch_id', sa.Uuid(), nullable=True))
        batch.add_column(sa.Column('custom_id', sa.String(length=256), nullable=True))
    op.create_index(
        'ix_jobs_batch',
        'jobs',
        ['batch_id', 'status'],
        unique=False,
        postgresql_where=sa.text('batch_id IS NOT NULL'),
        sqlite_where=sa.text('batch_id IS NOT NULL'),
    )
    with op.batch_alter_table('webhook_events') as batch:
        batch.alter_column('job_id', existing_type=sa.Uuid(), nullable=True)
        batch.add_column(sa.Column('batch_id', sa.Uuid(), nullable=True))
        batch.create_foreign_key(
            'fk_webhook_events_batch_id_batches', 'batches', ['batch_id'], ['id'], ondelete='CASCADE'
        )
    op.create_index('ix_webhook_events_batch_id', 'webhook_events', ['batch_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_webhook_events_batch_id', table_name='webhook_events')
    op.execute('DELETE FROM webhook_events WHERE job_id IS NULL')
    with op.batch_alter_table('webhook_events') as batch:
        batch.drop_constraint('fk_webhook_events_batch_id_batches', type_='foreignkey')
        batch.drop_column('batch_id')
        batch.alter_column('job_id', existing_type=sa.Uuid(), nullable=False)
    op.drop_index('ix_jobs_batch', table_name='jobs')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('custom_id')
        batch.drop_column('batch_id')
    op.drop_index('ix_files_tenant_id_id', table_name='files')
    op.drop_table('files')
    op.drop_index('ix_batches_open', table_name='batches')
    op.drop_index('uq_batches_tenant_id_idempotency_key', table_name='batches')
    op.drop_index('ix_batches_tenant_id_id', table_name='batches')
    op.drop_table('batches')
