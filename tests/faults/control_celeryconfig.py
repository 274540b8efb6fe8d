"""The control run's Celery settings: ours, minus requeueing a lost pool child's job.

Used only by the fault suite's control scenario (DIFFQ_CELERY_CONFIG), to show that the
harness sees the losses this setting prevents.
"""

from celeryconfig import *  # noqa: F403

task_reject_on_worker_lost = False
