"""Prometheus metrics: process-local instruments (multiprocess-safe under gunicorn and
Celery prefork) and their exposition. Scrape-time readings of PostgreSQL and RabbitMQ are
`app.gauges`."""
