"""The partition scenarios' Celery settings: ours, with a 4 s AMQP heartbeat.

Used by the worker in a network namespace (tests/faults/test_partitions.py, through
DIFFQ_CELERY_CONFIG), so that both the broker and the worker notice a silent link within
seconds instead of a minute (two missed heartbeats), and a partition longer than the
heartbeat fits the suite's time budget.
"""

from celeryconfig import *  # noqa: F403

broker_heartbeat = 4
