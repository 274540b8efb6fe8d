"""Gauges read at scrape time from the sources of truth: jobs and usage in PostgreSQL
(`readings`), the broker's queues (`readings.BrokerReadings`), and the backlog in GPU
time the autoscalers read (`backlog`). Above `app.jobs`, which they read; the counters
and histograms the code bumps as things happen are `app.metrics`, below it."""
