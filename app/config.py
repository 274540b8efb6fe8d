"""Settings read from the environment, with the embedded defaults when nothing is set."""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

# kombu's filesystem transport under DIFFQ_HOME/broker (registered in app/broker/embedded.py).
EMBEDDED_BROKER_URL = "diffqfs://localhost//"


def _parsed(env: Mapping[str, str], name: str, default, parse, what: str):
    """`name`'s value read by `parse`, `default` when unset or empty; a value `parse`
    refuses is a ValueError that names the variable and says what it must be."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be {what}, got {raw!r}") from exc


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return _parsed(env, name, default, int, "an integer")


# Standard Webhooks' schedule: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (~27.6 h in all).
WEBHOOK_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)


def _floats(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    def parse(raw: str) -> tuple[float, ...]:
        return tuple(float(part) for part in raw.split(","))

    values = _parsed(env, name, default, parse, "comma-separated seconds")
    if any(v < 0 for v in values):
        raise ValueError(f"{name} must not be negative, got {env.get(name)!r}")
    return values


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = (env.get(name) or choices[0]).strip().lower()
    if raw not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def _positive(value: float, name: str) -> float:
    if value <= 0:
        raise ValueError(f"{name} must be more than 0, got {value:g}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    return _parsed(env, name, default, float, "a number")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _prices(env: Mapping[str, str], name: str) -> dict[str, float]:
    """`device=price` pairs separated by `;` (device names hold commas and spaces)."""
    raw = env.get(name) or ""
    prices: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in raw.split(";"))):
        device, sep, price = part.rpartition("=")
        try:
            if not sep or not device.strip():
                raise ValueError
            prices[device.strip()] = float(price)
        except ValueError as exc:
            raise ValueError(
                f"{name} must be 'device=price' pairs separated by ';', got {part!r}"
            ) from exc
    return prices


@dataclass(frozen=True)
class Settings:
    """Everything diffq reads from its environment; see the README's configuration table."""

    home: Path
    database_url: str
    database_listen_url: str  # LISTEN connections' (a pooler cannot keep them)
    database_pooled: bool  # database_url is a transaction pooler's (PgBouncer)
    broker_url: str
    storage_url: str
    s3_endpoint_url: str | None
    s3_public_endpoint_url: str | None
    s3_region: str
    s3_create_bucket: bool
    presign_ttl: int
    models_file: Path | None
    secret_key: str
    max_body_bytes: int
    # Input images (POST /v1/uploads, a job's `data:` URIs): bytes and pixels an upload
    # may have, how long an upload is kept unless a job needs it longer, and the most an
    # inline `data:` URI may hold (decoded).
    input_max_bytes: int
    input_max_pixels: int
    input_ttl: float
    data_uri_max_bytes: int
    # LoRA adapters (app/addons/lora/): the largest upload; the bytes of adapters a
    # worker keeps in CPU memory (LRU), and the bytes and count of those it keeps loaded
    # in each model's pipeline, on its device (LRU).
    adapter_max_bytes: int
    adapter_cache_bytes: int
    adapter_device_bytes: int
    adapter_slots: int
    # Warmth (docs/fair-share.md): how many times the fair choice may be passed over for
    # a job whose weights a worker holds (0: warmth ignored), and by how many weighted
    # GPU-seconds of recent use the warm job's tenant may be ahead of the fairest.
    warm_max_skips: int
    # The hold (docs/fair-share.md): seconds after it was queued that a job whose model
    # this worker does not hold is left to a busy worker that holds it (0: no hold).
    warm_hold_seconds: float
    # Loaded pipelines a worker process holds at most (LRU; 0: no bound in count), and the
    # bytes their weights may take on its device (0: on a GPU, 70 % of its memory; on the
    # CPU, no bound). The served models that fit are loaded at start, others when needed.
    worker_max_models: int
    # ControlNets a worker keeps loaded beside each model (app/addons/controlnet/
    # worker.py, LRU): at most so many, and so many bytes of their weights (one is
    # always let in).
    worker_controlnets: int
    worker_controlnet_bytes: int
    # Bytes of text-encoder outputs a worker keeps on its device (workers/conditioning.py;
    # 0: none kept).
    worker_conditioning_bytes: int
    worker_model_bytes: int
    warm_share_slack: float
    http_keepalive: float
    # Slow clients (app/web/request_reader.py): seconds a request's headers may take to
    # arrive, seconds its body may go without a byte, and connections one API process
    # holds (a waiting one costs a socket, not a thread).
    http_header_timeout: float
    http_body_timeout: float
    http_max_connections: int
    # Seconds ahead the demand forecast looks for its busiest 5 minutes
    # (app/jobs/forecast.py): your GPU nodes' time to arrive, and a margin.
    forecast_lookahead: float
    max_attempts: int
    # RabbitMQ's consumer_timeout, seconds, as the broker is configured: a model's
    # time_limit must end 300 s before it, unless its jobs checkpoint and run alone: those
    # hand a delivery back before it and resume (app/catalog.py `spans_deliveries`).
    broker_consumer_timeout: int
    upload_retries: int
    upload_backoff: float
    upload_backoff_max: float
    progress_interval: float
    # How a progress write reaches event streams (docs/scale.md): "carried", its
    # notification carries the progress, so streams need not read the row; "wake", the
    # notification only wakes them to read it (the form API processes older than this
    # version understand); "poll", it notifies nothing and each API process reads its
    # streams' running jobs every 0.25 s in one statement (a fleet's notifications cut
    # by about 80 %). Workers and API processes read the same setting.
    progress_notify: str
    lease_seconds: float
    sse_keepalive: float
    priority_aging: float
    shutdown_grace: float
    shutdown_finish: float
    db_retry_seconds: float
    celery_config: str
    publish_timeout: float
    relay_after: float
    # An idle worker whose queues hold jobs published this long ago reopens its broker
    # connection, then has them published again (workers/stranded.py); 0: never.
    stranded_after: float
    # A GPU worker looks this often which of its models are paused (workers/pausing.py);
    # a delivery of a paused model is held this long before it goes back to the queue.
    pause_poll: float
    # Preemption (app/housekeeping/preemption.py): a `high` job waiting this long makes a
    # long lower-priority job yield (0: never); a job with less left finishes; a job is
    # preempted at most this many times.
    preempt_after: float
    preempt_min_left: float
    max_preemptions: int
    api_bind: str
    device: str
    log_level: str
    log_format: str  # "text" or "json"
    metrics_dir: Path  # prometheus_client multiprocess files, one folder per process tree
    # torch.compile's kernels kept between worker starts (workers/compiled.py): inductor's
    # cache (TORCHINDUCTOR_CACHE_DIR) unless the environment names its own.
    compile_cache: Path
    worker_metrics_port: int  # 0: a worker serves no /metrics
    relay_metrics_port: int  # 0: the relay serves no /metrics (on worker_metrics_host)
    worker_metrics_host: str
    rabbitmq_api_url: str | None  # RabbitMQ's management API, for Flower's broker tab
    flower_auth: str | None  # user:password for Flower's basic authentication
    public_url: str  # the API's external base URL, for links in webhook bodies
    webhook_schedule: tuple[float, ...]  # seconds before each retry of a webhook
    webhook_timeout: float  # seconds per delivery attempt (connect, then read)
    webhook_allow_cidrs: str | None  # private ranges webhooks may reach anyway
    rate_limit: int  # requests a minute per API key; 0: none
    max_queued: int  # queued jobs per tenant; 0: no cap
    max_running: int  # a tenant's jobs in flight (in the broker or running); 0: no cap
    result_retention: float  # seconds a succeeded job's images are kept; 0: forever
    fair_share: bool  # the next job of a pool comes from the tenant with the least GPU time
    fair_share_window: float  # seconds of recent GPU time that fair share compares
    gpu_prices: dict[str, float]  # price of one GPU-second per device name ("*": any other)
    price_currency: str
    metrics_top_tenants: int  # tenants named in per-tenant metrics; the rest sum as "other"
    max_wait: int  # cap on `Prefer: wait=N` and the OpenAI endpoint's wait, seconds
    wait_slots: int  # requests one API process holds waiting at once; past it, no wait
    ws_ticket_ttl: int  # seconds a WebSocket ticket stays valid
    job_retention: float  # seconds a finished job's row is kept; 0: forever
    queue_type: str  # classic | quorum: the type of every work queue and its DLQ
    batch_max_bytes: int = 64 * 1024 * 1024  # a batch's body or input file, bytes
    batch_max_lines: int = 50_000  # a batch's requests
    # Finished jobs waiting for their encode/upload/record while the GPU runs the next
    # (workers/postprocess.py); 0: all of it inline, before the next job starts.
    postprocess_depth: int = 2
    # docs/security.md: failed authentications a minute per client address and per key
    # id, per API process (0: not limited); open event streams (SSE and WebSocket) per
    # API process and per tenant in each process (0: no cap).
    auth_failures: int = 30
    max_streams: int = 192
    max_tenant_streams: int = 16
    # The API's /metrics: its own port (0: not served) and address; seconds the database
    # aggregates of a scrape are reused.
    api_metrics_port: int = 9806
    api_metrics_host: str = "127.0.0.1"
    metrics_cache_ttl: float = 5.0
    # Peers whose X-Forwarded-For is believed (addresses or networks, comma-separated).
    trusted_proxies: str = ""
    # Origins a browser's WebSocket may come from (comma-separated; default: the public
    # URL's origin).
    public_origins: tuple[str, ...] = ()

    @property
    def broker_folder(self) -> Path:
        return self.home / "broker"

    @property
    def tiny_model_dir(self) -> Path:
        return self.home / "models" / "tiny"

    @property
    def tiny_video_model_dir(self) -> Path:
        return self.home / "models" / "tiny-video"

    @property
    def tiny_controlnet_dir(self) -> Path:
        return self.home / "models" / "tiny-controlnet"


def _secret_key(env: Mapping[str, str], home: Path) -> str:
    """The key that signs local file URLs; generated once per home when not given."""
    given = env.get("DIFFQ_SECRET_KEY")
    if given:
        return given
    path = home / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        home.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        return key
    except OSError:
        # An unwritable home still gets a working (per-process) key.
        return secrets.token_urlsafe(32)


def _public_url(env: Mapping[str, str]) -> str:
    """DIFFQ_PUBLIC_URL, else the API's bind address (a wildcard host read as loopback)."""
    given = (env.get("DIFFQ_PUBLIC_URL") or "").strip().rstrip("/")
    if given:
        parts = urlsplit(given)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ValueError(f"DIFFQ_PUBLIC_URL must be an http(s) base URL, got {given!r}")
        return given
    host, _, port = (env.get("DIFFQ_API_BIND") or "127.0.0.1:8000").rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def _origins(env: Mapping[str, str], public_url: str) -> tuple[str, ...]:
    raw = env.get("DIFFQ_PUBLIC_ORIGINS") or ""
    origins = [o.strip().rstrip("/") for o in raw.split(",") if o.strip()]
    if not origins:
        parts = urlsplit(public_url)
        origins = [f"{parts.scheme}://{parts.netloc}"]
        # On loopback (the embedded default), the page may be opened under either name.
        for one, other in (("127.0.0.1", "localhost"), ("localhost", "127.0.0.1")):
            if parts.hostname == one:
                port = f":{parts.port}" if parts.port else ""
                origins.append(f"{parts.scheme}://{other}{port}")
    return tuple(o.lower() for o in origins)


def _networks(env: Mapping[str, str], name: str) -> str:
    raw = env.get(name) or ""
    for part in filter(None, (p.strip() for p in raw.split(","))):
        try:
            ipaddress.ip_network(part, strict=False)
        except ValueError as exc:
            raise ValueError(f"{name} must be addresses or networks, got {part!r}") from exc
    return raw


def _database_url(env: Mapping[str, str], home: Path, name: str = "DIFFQ_DATABASE_URL") -> str:
    """DIFFQ_DATABASE_URL, or SQLite under DIFFQ_HOME. diffq speaks to PostgreSQL through
    psycopg2 (its submit path uses the driver's cursor): a URL without a driver
    (`postgresql://`, `postgres://`) means psycopg2, where SQLAlchemy 2.1 would pick
    psycopg 3, which is not installed; another driver is refused, naming the variable.
    `name` DIFFQ_DATABASE_LISTEN_URL: that URL, else DIFFQ_DATABASE_URL's."""
    raw = env.get(name) or env.get("DIFFQ_DATABASE_URL") or f"sqlite:///{home / 'diffq.sqlite3'}"
    scheme, _, rest = raw.partition("://")
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg2://{rest}"
    if scheme.startswith("postgresql+") and scheme != "postgresql+psycopg2":
        raise ValueError(
            f"{name}: diffq uses the psycopg2 driver; write postgresql:// "
            f"or postgresql+psycopg2://, not {scheme}://"
        )
    return raw


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    home = Path(env.get("DIFFQ_HOME") or Path.home() / ".diffq").expanduser()
    models_file = env.get("DIFFQ_MODELS_FILE")
    public_url = _public_url(env)
    return Settings(
        home=home,
        database_url=_database_url(env, home),
        database_listen_url=_database_url(env, home, "DIFFQ_DATABASE_LISTEN_URL"),
        database_pooled=_bool(env, "DIFFQ_DATABASE_POOLED", False),
        broker_url=env.get("DIFFQ_BROKER_URL") or EMBEDDED_BROKER_URL,
        storage_url=env.get("DIFFQ_STORAGE_URL") or f"file://{home / 'images'}",
        s3_endpoint_url=env.get("DIFFQ_S3_ENDPOINT_URL") or None,
        s3_public_endpoint_url=env.get("DIFFQ_S3_PUBLIC_ENDPOINT_URL") or None,
        s3_region=env.get("DIFFQ_S3_REGION") or "us-east-1",
        s3_create_bucket=_bool(env, "DIFFQ_S3_CREATE_BUCKET", False),
        presign_ttl=_int(env, "DIFFQ_PRESIGN_TTL", 900),
        models_file=Path(models_file).expanduser() if models_file else None,
        secret_key=_secret_key(env, home),
        # Room for a job's two inline `data:` URIs (base64) beside its other fields.
        max_body_bytes=_int(env, "DIFFQ_MAX_BODY_BYTES", 1024 * 1024),
        input_max_bytes=_int(env, "DIFFQ_INPUT_MAX_BYTES", 20 * 1024 * 1024),
        input_max_pixels=_int(env, "DIFFQ_INPUT_MAX_PIXELS", 4096 * 4096),
        input_ttl=_float(env, "DIFFQ_INPUT_TTL", 86400.0),
        data_uri_max_bytes=_int(env, "DIFFQ_DATA_URI_MAX_BYTES", 256 * 1024),
        adapter_max_bytes=_int(env, "DIFFQ_ADAPTER_MAX_BYTES", 512 * 1024 * 1024),
        adapter_cache_bytes=_int(env, "DIFFQ_ADAPTER_CACHE_BYTES", 4 * 1024 * 1024 * 1024),
        adapter_device_bytes=_int(env, "DIFFQ_ADAPTER_DEVICE_BYTES", 1024 * 1024 * 1024),
        adapter_slots=_int(env, "DIFFQ_ADAPTER_SLOTS", 16),
        warm_max_skips=_int(env, "DIFFQ_WARM_MAX_SKIPS", 8),
        warm_hold_seconds=_float(env, "DIFFQ_WARM_HOLD_SECONDS", 20.0),
        worker_max_models=_int(env, "DIFFQ_WORKER_MAX_MODELS", 0),
        worker_controlnets=_int(env, "DIFFQ_WORKER_CONTROLNETS", 4),
        worker_controlnet_bytes=_int(env, "DIFFQ_WORKER_CONTROLNET_BYTES", 8 * 1024 * 1024 * 1024),
        worker_conditioning_bytes=_int(env, "DIFFQ_WORKER_CONDITIONING_BYTES", 256 * 1024**2),
        worker_model_bytes=_int(env, "DIFFQ_WORKER_MODEL_BYTES", 0),
        warm_share_slack=_float(env, "DIFFQ_WARM_SHARE_SLACK", 60.0),
        # Idle seconds a client connection is kept open: longer than the load balancer's
        # idle timeout (60 s on most clouds), so the balancer always closes first.
        http_keepalive=_float(env, "DIFFQ_HTTP_KEEPALIVE", 75.0),
        http_header_timeout=_positive(
            _float(env, "DIFFQ_HTTP_HEADER_TIMEOUT", 10.0), "DIFFQ_HTTP_HEADER_TIMEOUT"
        ),
        http_body_timeout=_positive(
            _float(env, "DIFFQ_HTTP_BODY_TIMEOUT", 10.0), "DIFFQ_HTTP_BODY_TIMEOUT"
        ),
        forecast_lookahead=_positive(
            _float(env, "DIFFQ_FORECAST_LOOKAHEAD", 600.0), "DIFFQ_FORECAST_LOOKAHEAD"
        ),
        http_max_connections=int(
            _positive(_int(env, "DIFFQ_HTTP_MAX_CONNECTIONS", 10000), "DIFFQ_HTTP_MAX_CONNECTIONS")
        ),
        max_attempts=_int(env, "DIFFQ_MAX_ATTEMPTS", 3),
        broker_consumer_timeout=_int(env, "DIFFQ_BROKER_CONSUMER_TIMEOUT", 1800),
        upload_retries=_int(env, "DIFFQ_UPLOAD_RETRIES", 5),
        upload_backoff=_float(env, "DIFFQ_UPLOAD_BACKOFF", 0.5),
        upload_backoff_max=_float(env, "DIFFQ_UPLOAD_BACKOFF_MAX", 8.0),
        progress_interval=_float(env, "DIFFQ_PROGRESS_INTERVAL", 0.25),
        progress_notify=_choice(env, "DIFFQ_PROGRESS_NOTIFY", ("carried", "wake", "poll")),
        lease_seconds=_float(env, "DIFFQ_LEASE_SECONDS", 60.0),
        sse_keepalive=_float(env, "DIFFQ_SSE_KEEPALIVE", 15.0),
        priority_aging=_float(env, "DIFFQ_PRIORITY_AGING", 300.0),
        shutdown_grace=_float(env, "DIFFQ_SHUTDOWN_GRACE", 60.0),
        shutdown_finish=_float(env, "DIFFQ_SHUTDOWN_FINISH", 10.0),
        db_retry_seconds=_float(env, "DIFFQ_DB_RETRY", 60.0),
        celery_config=env.get("DIFFQ_CELERY_CONFIG") or "celeryconfig",
        publish_timeout=_float(env, "DIFFQ_PUBLISH_TIMEOUT", 2.0),
        relay_after=_float(env, "DIFFQ_RELAY_AFTER", 5.0),
        stranded_after=_float(env, "DIFFQ_STRANDED_AFTER", 60.0),
        pause_poll=_float(env, "DIFFQ_PAUSE_POLL", 1.0),
        preempt_after=_float(env, "DIFFQ_PREEMPT_AFTER", 2.0),
        preempt_min_left=_float(env, "DIFFQ_PREEMPT_MIN_LEFT", 30.0),
        max_preemptions=_int(env, "DIFFQ_MAX_PREEMPTIONS", 2),
        api_bind=env.get("DIFFQ_API_BIND") or "127.0.0.1:8000",
        device=env.get("DIFFQ_DEVICE") or "auto",
        log_level=env.get("DIFFQ_LOG_LEVEL") or "INFO",
        log_format=_choice(env, "DIFFQ_LOG_FORMAT", ("text", "json")),
        metrics_dir=Path(env.get("DIFFQ_METRICS_DIR") or home / "metrics").expanduser(),
        compile_cache=Path(env.get("DIFFQ_COMPILE_CACHE") or home / "compile-cache").expanduser(),
        worker_metrics_port=_int(env, "DIFFQ_WORKER_METRICS_PORT", 9808),
        relay_metrics_port=_int(env, "DIFFQ_RELAY_METRICS_PORT", 9809),
        worker_metrics_host=env.get("DIFFQ_WORKER_METRICS_HOST") or "127.0.0.1",
        rabbitmq_api_url=env.get("DIFFQ_RABBITMQ_API_URL") or None,
        flower_auth=env.get("DIFFQ_FLOWER_AUTH") or None,
        public_url=public_url,
        webhook_schedule=_floats(env, "DIFFQ_WEBHOOK_SCHEDULE", WEBHOOK_SCHEDULE),
        webhook_timeout=_float(env, "DIFFQ_WEBHOOK_TIMEOUT", 10.0),
        webhook_allow_cidrs=env.get("DIFFQ_WEBHOOK_ALLOW_CIDRS") or None,
        rate_limit=_int(env, "DIFFQ_RATE_LIMIT", 600),
        max_queued=_int(env, "DIFFQ_MAX_QUEUED", 1000),
        max_running=_int(env, "DIFFQ_MAX_RUNNING", 0),
        result_retention=_float(env, "DIFFQ_RESULT_RETENTION", 30 * 86400.0),
        fair_share=_bool(env, "DIFFQ_FAIR_SHARE", True),
        fair_share_window=_float(env, "DIFFQ_FAIR_SHARE_WINDOW", 600.0),
        gpu_prices=_prices(env, "DIFFQ_GPU_PRICES"),
        price_currency=env.get("DIFFQ_PRICE_CURRENCY") or "USD",
        metrics_top_tenants=_int(env, "DIFFQ_METRICS_TOP_TENANTS", 10),
        postprocess_depth=_int(env, "DIFFQ_POSTPROCESS_DEPTH", 2),
        max_wait=_int(env, "DIFFQ_MAX_WAIT", 60),
        wait_slots=_int(env, "DIFFQ_WAIT_SLOTS", 128),
        ws_ticket_ttl=_int(env, "DIFFQ_WS_TICKET_TTL", 60),
        job_retention=_float(env, "DIFFQ_JOB_RETENTION", 90 * 86400.0),
        queue_type=_choice(env, "DIFFQ_QUEUE_TYPE", ("classic", "quorum")),
        batch_max_bytes=_int(env, "DIFFQ_BATCH_MAX_BYTES", 64 * 1024 * 1024),
        batch_max_lines=_int(env, "DIFFQ_BATCH_MAX_LINES", 50_000),
        auth_failures=_int(env, "DIFFQ_AUTH_FAILURES", 30),
        max_streams=_int(env, "DIFFQ_MAX_STREAMS", 192),
        max_tenant_streams=_int(env, "DIFFQ_MAX_TENANT_STREAMS", 16),
        api_metrics_port=_int(env, "DIFFQ_API_METRICS_PORT", 9806),
        api_metrics_host=env.get("DIFFQ_API_METRICS_HOST") or "127.0.0.1",
        metrics_cache_ttl=_float(env, "DIFFQ_METRICS_CACHE_TTL", 5.0),
        trusted_proxies=_networks(env, "DIFFQ_TRUSTED_PROXIES"),
        public_origins=_origins(env, public_url),
    )
