"""Prometheus metrics: process-local instruments (multiprocess-safe under gunicorn and
Celery prefork), scrape-time readings of PostgreSQL and RabbitMQ, and their exposition."""
