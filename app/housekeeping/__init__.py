"""Housekeeping: the passes `diffq relay` runs every couple of seconds.

- `outbox`: publish queued jobs whose first publish was never confirmed; hand due webhook
  events to the delivery workers.
- `leases`: requeue (or fail past the attempt cap) running jobs whose lease expired.
- `deadlines`: cancel queued jobs past their `cancel_after`.
- `aging`: republish long-waiting jobs one priority level up.
- `admission`: let held jobs through as their tenant's jobs in flight finish.
- `retention`: remove images past DIFFQ_RESULT_RETENTION; `purge`: delete finished jobs
  past DIFFQ_JOB_RETENTION.
- `relay`: one pass of all of them, in order.
"""
