"""Batches: many jobs submitted as one (POST /v1/batches, docs/batches.md).

- `ingest`: storing and publishing a batch's jobs in bulk, a chunk per transaction, the
  confirms awaited per chunk (app/broker/bulk.py); idempotent and resumable.
- `lifecycle`: counts per state, the status shown, cancel, the completion window, the
  end (files and the completion webhook), purge.
- `render`: the batch object (OpenAI's Batch with diffq's fields), the results file and
  the output and error files, rendered from the jobs when read.

A batch's jobs are ordinary jobs (`jobs.batch_id`, `jobs.custom_id`): the same quota,
caps, fair share, workers, cancel and retention as any other.
"""
