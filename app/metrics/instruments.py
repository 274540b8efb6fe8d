"""Every instrument diffq records to, by the process that records it.

Label values are bounded: routes are URL rules (not paths), models and queues come from
the catalog, error codes from app.jobs.states.ErrorCode.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
GENERATION_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)

# --- API (gunicorn processes) ------------------------------------------------------
HTTP_REQUESTS = Counter(
    "diffq_http_requests",
    "HTTP requests answered, by route (URL rule), method and status code",
    ["route", "method", "status"],
)
HTTP_DURATION = Histogram(
    "diffq_http_request_duration_seconds",
    "Time to answer an HTTP request (event streams: time to the first byte)",
    ["route", "method"],
    buckets=LATENCY_BUCKETS,
)
# What the API's HPA scales on (through prometheus-adapter): requests being answered now,
# summed over the live gunicorn processes; event streams are left out (they are held open).
HTTP_IN_FLIGHT = Gauge(
    "diffq_http_requests_in_flight",
    "HTTP requests being answered now (event streams excluded)",
    multiprocess_mode="livesum",
)
HTTP_CUT = Counter(
    "diffq_http_requests_cut",
    "Requests closed before they reached a thread: too_large (a 413 from Content-Length), "
    "header_timeout or body_timeout (a 408)",
    ["reason"],
)
JOBS_SUBMITTED = Counter(
    "diffq_jobs_submitted", "Jobs accepted by POST /v1/jobs (202), by model", ["model"]
)
CACHE_HITS = Counter(
    "diffq_result_cache_hits",
    "Jobs answered from the result cache (no GPU run), by model",
    ["model"],
)

# --- Workers (Celery pool children and their main process) -------------------------
JOBS_FINISHED = Counter(
    "diffq_jobs_finished",
    "Jobs a worker brought to a terminal state, by model, status and error code",
    ["model", "status", "error_code"],
)
# A model's start in a pool process, by phase: "load" (from_pretrained), "device" (moved
# to the GPU), "warm_up" (one short job), "warm_up WxH" (each compile tier compiled).
MODEL_START_SECONDS = Gauge(
    "diffq_worker_model_start_seconds",
    "Seconds a worker process spent starting a model, by phase",
    ["model", "phase"],
    multiprocess_mode="liveall",
)
# What a pool process holds on its device (workers/models.py): the bytes of its loaded
# models' weights (each pipeline once), and the budget that bounds them (0: none).
WORKER_MODEL_BYTES = Gauge(
    "diffq_worker_model_bytes",
    "Bytes of model weights a worker process holds loaded on its device (each pipeline once)",
    multiprocess_mode="liveall",
)
WORKER_MODEL_BUDGET = Gauge(
    "diffq_worker_model_budget_bytes",
    "The bytes of model weights a worker process may hold loaded (DIFFQ_WORKER_MODEL_BYTES "
    "or 70 % of the GPU; 0: no bound)",
    multiprocess_mode="liveall",
)
GENERATION_DURATION = Histogram(
    "diffq_generation_duration_seconds",
    "Denoising and decoding time of a succeeded job, by model and step count",
    ["model", "steps"],
    buckets=GENERATION_BUCKETS,
)
STEP_DURATION = Histogram(
    "diffq_step_duration_seconds",
    "Mean time of one denoising step in a job, by model",
    ["model"],
    buckets=STEP_BUCKETS,
)
BATCH_SIZE = Histogram(
    "diffq_batch_size",
    "Jobs in one pipeline call of a batching model (dynamic batching), by model",
    ["model"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
)
BATCH_WAIT = Histogram(
    "diffq_batch_wait_seconds",
    "Time a batching model's first job waited for compatible jobs to fill its batch",
    ["model"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ADAPTER_LOADS = Counter(
    "diffq_adapter_loads",
    "LoRA adapters loaded by a worker, by where from: store (read and parsed into CPU "
    "memory) or memory (from its CPU cache into a model's pipeline)",
    ["source"],
)
ADAPTER_HITS = Counter(
    "diffq_adapter_hits",
    "Adapters a job needed that a worker already held, by where: memory (its CPU cache) "
    "or pipeline (already loaded in the model's pipeline)",
    ["level"],
)
COMPILED_GRAPHS = Counter(
    "diffq_worker_compiled_graphs",
    "Graphs torch.compile traced during a model's calls on its compiled denoiser: each "
    "tier's at the warm-up, then a recompile (tens of seconds on a GPU) whenever a call "
    "breaks a guard; a new LoRA adapter or scale hot-swapped into a compiled model is none",
    ["model"],
)
CONDITIONING_HITS = Counter(
    "diffq_conditioning_cache_hits",
    "Prompt encodings a worker took from its conditioning cache, by model",
    ["model"],
)
CONDITIONING_MISSES = Counter(
    "diffq_conditioning_cache_misses",
    "Prompt encodings a worker ran and kept, by model",
    ["model"],
)
CONDITIONING_SECONDS_SAVED = Counter(
    "diffq_conditioning_cache_saved_seconds",
    "Encoding seconds the conditioning cache's hits saved (each entry's own encode time)",
    ["model"],
)
ADAPTER_EVICTIONS = Counter(
    "diffq_adapter_evictions",
    "Adapters a worker let go of to make room, by where: memory or pipeline",
    ["level"],
)
ADAPTER_LOAD_DURATION = Histogram(
    "diffq_adapter_load_seconds",
    "Time to load one adapter, by where from: store or memory",
    ["source"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
MODEL_LOAD_DURATION = Histogram(
    "diffq_model_load_seconds",
    "Time to load a model's pipeline and to warm it up, by model and phase (load, warm_up)",
    ["model", "phase"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
WORKER_HOLD_SECONDS = Counter(
    "diffq_worker_hold_seconds",
    "Seconds a worker's claim waited, its message unacked, because the waiting jobs' "
    "models were loaded on busy workers (DIFFQ_WARM_HOLD_SECONDS), by queue",
    ["queue"],
)
WORKER_BUSY = Counter(
    "diffq_worker_busy_seconds",
    "Seconds a worker spent holding a job; its rate is the worker's busy fraction",
    ["worker"],
)

# --- The relay (`diffq relay`) ------------------------------------------------------------
# Its passes publish what missed its first publish, requeue lost workers' jobs, cancel
# jobs past their deadline and hand webhook events to the delivery workers: a relay that
# stopped passing stops all of that (the DiffqRelayStalled alert).
RELAY_PASSES = Counter(
    "diffq_relay_passes",
    "Relay passes by outcome: ok, failed (an error, a database or broker outage)",
    ["outcome"],
)
RELAY_PASS_DURATION = Histogram(
    "diffq_relay_pass_duration_seconds",
    "Time of one relay pass, every housekeeping step once",
    buckets=LATENCY_BUCKETS,
)

# --- Webhook delivery workers ----------------------------------------------------------
WEBHOOK_DELIVERIES = Counter(
    "diffq_webhook_deliveries",
    "Webhook delivery attempts by outcome: delivered, retry, failed (schedule exhausted), "
    "gone (410), refused (SSRF guard)",
    ["outcome"],
)
WEBHOOK_LATENCY = Histogram(
    "diffq_webhook_attempt_duration_seconds",
    "Time of one delivery attempt, from resolving the host to the answer",
    buckets=LATENCY_BUCKETS,
)
