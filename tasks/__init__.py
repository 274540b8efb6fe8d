"""Celery tasks for diffq; `celery -A tasks …` finds the app here."""

from tasks.celery_app import app

__all__ = ["app"]
