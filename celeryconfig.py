"""Celery settings for diffq (see the README's configuration table).

Static settings only: importing this module reads nothing and imports nothing of diffq.
The broker URL, its transport options and the queues come from the process's root when
the Celery app is first configured (app/broker/celery.py: the broker backend's
`celery_settings`). A module named by DIFFQ_CELERY_CONFIG can `from celeryconfig import *`
and override any of these, or those.
"""

# --- Broker ------------------------------------------------------------------------
broker_connection_retry_on_startup = True
broker_heartbeat = 30
worker_consumer = "tasks.reconnect:Consumer"  # reconnects every 0.5-2 s, not 2-30 s

# --- Messages: JSON only, persistent, no result backend (PostgreSQL holds job state) --
task_serializer = "json"
accept_content = ["json"]
result_serializer = "json"
task_default_delivery_mode = "persistent"
task_ignore_result = True
result_backend = None

# --- Queues (the queues themselves: the broker backend's celery_settings) ---------------
task_create_missing_queues = False

# --- Reliability -------------------------------------------------------------------
task_acks_late = True  # ack after the job's outcome is recorded, not on receipt
task_reject_on_worker_lost = True  # a killed pool child's job is redelivered, not lost
# The task records every outcome and rejects failures to the DLQ itself; whatever still
# escapes it (or a hard time limit) is dead-lettered rather than acked and forgotten.
task_acks_on_failure = False
task_acks_on_timeout = False
worker_prefetch_multiplier = 1  # a GPU worker holds one job at a time
# A broker blip must not kill the pool process: that costs the model's reload and the
# running job. The job runs on; its message comes back after the reconnect (redelivered),
# and its lease in PostgreSQL decides who records the outcome (see docs/gpu.md).
worker_cancel_long_running_tasks_on_connection_loss = False
worker_pool = "prefork"
worker_concurrency = 1  # one process per GPU; `diffq worker` starts one worker per GPU
# A pool process loads its models before it reports "up"; Celery's 4 s default would kill
# every replacement of a crashed process mid-load, forever (found by the fault suite, F1).
worker_proc_alive_timeout = 600
# Defaults for messages that carry none; each model's own limits ride on its messages,
# inside RabbitMQ's consumer_timeout (app/catalog.py `delivery_limits`).
task_soft_time_limit = 600
task_time_limit = 660

# --- Remote control (Flower, `celery inspect`) ------------------------------------------
# A worker's control queue (`<node>.celery.pidbox`) is not exclusive: when a worker
# fails over to another node of a cluster while the node it left still holds the old
# queue (paused by pause_minority, say), an exclusive queue would refuse the declare
# (RESOURCE_LOCKED) and Celery would stop the worker, reloading its models. It is still
# auto-deleted once unused (control_queue_expires).
control_queue_exclusive = False

# --- Events for Flower ---------------------------------------------------------------
worker_send_task_events = True
# No task-sent event: it is a second message, with its own confirm, on every submit
# (docs/submit.md). Flower lists a task from the moment a worker receives it; what waits
# in a queue is on its broker page and in /metrics.
task_send_sent_event = False
worker_hijack_root_logger = False
