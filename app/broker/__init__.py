"""The broker edge: everything diffq says to RabbitMQ (or the embedded broker).

- `topology`: the exchanges and queues (work queues with priorities, dead-letter queues),
  declared identically by every process.
- `publish`: publishing a job's message or a webhook event id with publisher confirms.
- `embedded`: the filesystem broker of `diffq up`.

Nothing outside this package builds kombu exchanges or queues; docs/brokers.md says what
another broker would have to provide to live behind it.
"""
