"""webhooks: tenants' signing secrets, jobs' webhook, the delivery outbox and attempts

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import base64
import secrets

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tenants', sa.Column('webhook_secret', sa.String(length=80), nullable=True))
    op.add_column('tenants', sa.Column('webhook_secret_previous', sa.String(length=80), nullable=True))
    op.add_column('tenants', sa.Column('webhook_secret_previous_until', sa.DateTime(timezone=True), nullable=True))
    # Existing tenants get their own secret, as a new tenant does. (The column stays
    # nullable: making it NOT NULL on SQLite means rebuilding tenants, which cascades.)
    bind = op.get_bind()
    for (tenant_id,) in bind.execute(sa.text("SELECT id FROM tenants")).fetchall():
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        bind.execute(
            sa.text("UPDATE tenants SET webhook_secret = :secret WHERE id = :id"),
            {"secret": secret, "id": tenant_id},
        )
    op.add_column('jobs', sa.Column('webhook_url', sa.Text(), nullable=True))
    op.add_column('jobs', sa.Column('webhook_events', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True))
    op.create_table(
        'webhook_events',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('job_id', sa.Uuid(), nullable=False),
        sa.Column('type', sa.String(length=40), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('payload', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('dispatched_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_webhook_events_due', 'webhook_events', ['next_attempt_at'], unique=False, postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    op.create_index('ix_webhook_events_job_id_created_at', 'webhook_events', ['job_id', 'created_at'], unique=False)
    op.create_table(
        'webhook_attempts',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('event_id', sa.Uuid(), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('status_code', sa.Integer(), nullable=True),
        sa.Column('latency_ms', sa.Integer(), nullable=True),
        sa.Column('error', sa.String(length=300), nullable=True),
        sa.ForeignKeyConstraint(['event_id'], ['webhook_events.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index(op.f('ix_webhook_attempts_event_id'), 'webhook_attempts', ['event_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_webhook_attempts_event_id'), table_name='webhook_attempts')
    op.drop_table('webhook_attempts')
    op.drop_index('ix_webhook_events_job_id_created_at', table_name='webhook_events')
    op.drop_index('ix_webhook_events_due', table_name='webhook_events', postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    op.drop_table('webhook_events')
    op.drop_column('jobs', 'webhook_events')
    op.drop_column('jobs', 'webhook_url')
    # Plain DROP COLUMN: a batch rebuild of tenants on SQLite would cascade to jobs.
    op.drop_column('tenants', 'webhook_secret_previous_until')
    op.drop_column('tenants', 'webhook_secret_previous')
    op.drop_column('tenants', 'webhook_secret')
