"""Worker start-up, one module per role, each on the Celery signals of its role only.

`common` runs in every worker: structured logs, and at `worker_init` (the main process,
before any pool child) it tells the role from the queues consumed and starts it: `gpu`
(models checked in the parent, loaded in each pool child, shutdown grace and hand-back,
hard-timeout records) or `webhooks` (a delivery worker: no model, no pool-child hooks).
"""

from tasks.boot import common  # noqa: F401  (connects the signals every worker uses)
