"""Within the broker's delivery timeout: a job that would outlast RabbitMQ's
consumer_timeout checkpoints and hands itself back before it, on a node of its own whose
timeout is 8 s (checked every second, as F22's), and resumes on its next delivery; its
model's soft_time_limit is a budget over every delivery."""

from __future__ import annotations

import re

import pytest
import requests

from app.catalog import hand_back_margin
from app.jobs.states import JobStatus
from testbed.jobs import auth
from testbed.processes import ApiServer, start_worker
from testbed.waiting import wait_until
from tests.faults.harness import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.services]

TIMEOUT = 8  # seconds: the node's consumer_timeout, and the workers' setting
# The fault catalog's tiny model (the same files, limits and defaults, so the same request
# makes the same bytes there), on a queue of its own, with a budget of 300 s over its
# deliveries; and one whose budget (6 s) a job spends in its second delivery.
MODELS = """\
default_model = "tiny-long"

[models.tiny-long]
path = "{tiny}"
queue = "gpu.f24"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
max_steps = 500
default_steps = 8
checkpoint_seconds = 0.5
soft_time_limit = 300
time_limit = 330

[models.tiny-budget]
path = "{tiny}"
queue = "gpu.f24"
dtype = "float32"
default_width = 64
default_height = 64
max_steps = 500
checkpoint_seconds = 0.5
soft_time_limit = 6
time_limit = 9
"""
# The most the fault catalog's tiny model takes (its twin runs there): 32 ms a step on
# this 2-core machine idle, several times that under the suite's load, so 16 s of running
# or more, twice the consumer timeout and more, each delivery handing back after 4 s.
JOB = {
    "prompt": "f24 a lighthouse",
    "seed": 24,
    "steps": 500,
    "width": 128,
    "height": 128,
    "num_images": 4,
}
CLOSED = re.compile(r"delivery acknowledgement|precondition_failed", re.IGNORECASE)


class Private:
    """An API and a worker on a private RabbitMQ node whose consumer_timeout is TIMEOUT,
    beside the fault stack (its database, store, relay and webhook delivery)."""

    def __init__(self, stack, workdir) -> None:
        from testbed.private_rabbit import PrivateRabbitMQ

        self.rabbit = PrivateRabbitMQ(
            workdir / "rabbit", consumer_timeout_ms=TIMEOUT * 1000, channel_tick_ms=1000
        )
        self.rabbit.start()
        self.logs = workdir
        models = workdir / "models.toml"
        models.write_text(MODELS.format(tiny=stack.logs.parent / "models" / "tiny"))
        self.env = {
            **stack.env,
            "DIFFQ_BROKER_URL": self.rabbit.url,
            "DIFFQ_MODELS_FILE": str(models),
            "DIFFQ_BROKER_CONSUMER_TIMEOUT": str(TIMEOUT),
        }
        self.api = self.worker = None
        try:
            assert self.rabbit.app_env("consumer_timeout") == f"{{ok,{TIMEOUT * 1000}}}"
            self.api = ApiServer(self.env, workdir, name="api-f24").start()
            self.worker = start_worker(
                self.env, workdir, "worker-f24", models="tiny-long,tiny-budget"
            )
        except BaseException:
            self.close()
            raise

    def broker_log(self) -> str:
        return "".join(
            path.read_text(errors="replace")
            for path in sorted((self.rabbit.workdir / "log").glob("*.log"))
        )

    def closed_channels(self) -> list[str]:
        """Lines where RabbitMQ closed a channel for an unacknowledged delivery."""
        text = self.worker.log() + self.broker_log()
        return [line for line in text.splitlines() if CLOSED.search(line)]

    def hand_backs(self, job_id: str) -> list[tuple[int, str]]:
        """(step, reason) of each time the worker handed the job back."""
        found = re.findall(
            rf"job {job_id} handed back at step (\d+): [^(]*\((\w+); ", self.worker.log()
        )
        return [(int(step), reason) for step, reason in found]

    def claims(self, job_id: str) -> int:
        return len(re.findall(rf"job {job_id} claimed \(attempt", self.worker.log()))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop(timeout=60)
        if self.api is not None:
            self.api.stop()
        self.rabbit.close()


@pytest.fixture(scope="module")
def private(fault_stack, tmp_path_factory):
    private = Private(fault_stack, tmp_path_factory.mktemp("f24"))
    yield private
    private.close()


def _job(api_url: str, key: str, job_id: str) -> dict:
    answer = requests.get(f"{api_url}/v1/jobs/{job_id}", headers=auth(key), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_f24_a_job_longer_than_the_consumer_timeout_hands_itself_back_in_time(fault_stack, private):
    """A job of several consumer timeouts: each delivery checkpoints and hands the job
    back before `consumer_timeout - hand_back_margin` (8 - 4 s), the next resumes it; it
    succeeds once, one result and one terminal change, no attempt spent; RabbitMQ never
    closed a channel for a delivery held too long; the manifest says why each resume
    came; its image is the bytes of the same job run without a hand-back."""
    stack = fault_stack
    sc = Scenario("F24 consumer_timeout, handed back", stack, stack.new_key(), private.api.url)
    job_id = sc.submit(model="tiny-long", **JOB)
    assert job_id is not None, sc.figures.line()
    rows = sc.settle(180)
    # The success's post-processing removes the checkpoint right after it records.
    wait_until(
        lambda: (
            sorted(k.rsplit("/", 1)[1] for k in stack.objects_of(sc.row(job_id)))
            == ["0.png", "1.png", "2.png", "3.png"]
        ),
        timeout=30,
        what="the checkpoint removed after the job's end",
    )
    hand_backs = private.hand_backs(job_id)
    claims = private.claims(job_id)
    sc.figures.faults = len(hand_backs)  # deliveries that would have outlasted the timeout
    # A claim after a hand-back resumes; any other would be a second generation.
    sc.figures.duplicate_generations = max(0, claims - 1 - len(hand_backs))
    fig = sc.report(rows)
    job = _job(private.api.url, sc.key, job_id)
    resumes = job["result"]["manifest"]["resumes"]
    delivered = re.findall(
        rf"job {job_id} handed back .* this delivery ran ([\d.]+)s", private.worker.log()
    )
    sc.figures.notes = (
        f"{len(hand_backs)} hand-backs at steps {[s for s, _ in hand_backs]} of {JOB['steps']}, "
        f"deliveries of {'/'.join(delivered)} s (hand-back by "
        f"{TIMEOUT - hand_back_margin(TIMEOUT):g} s, timeout {TIMEOUT} s)"
    )
    print(sc.figures.notes)
    assert fig.succeeded == 1 and fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0 and fig.duplicate_terminal == 0, fig.line()
    assert fig.duplicate_generations == 0 and fig.duplicate_deliveries == 0, fig.line()
    assert fig.undelivered == 0, fig.line()
    assert private.closed_channels() == []
    reasons = [reason for _, reason in hand_backs]
    assert "consumer_timeout" in reasons, hand_backs
    # A delivery's Celery soft limit (half the margin before the timeout) hands the job
    # back too if a hand-back's step ran that late: a machine far busier than its pace.
    assert set(reasons) <= {"consumer_timeout", "time_limit"}, hand_backs
    assert claims == len(hand_backs) + 1
    assert all(float(ran) < TIMEOUT for ran in delivered), delivered
    # Each hand-back's step is where the next run went on from, and says why.
    for (step, reason), resume in zip(hand_backs, resumes, strict=True):
        if reason == "consumer_timeout":
            assert (resume["from_step"], resume.get("reason")) == (step, reason), resumes
        else:  # stopped mid-step: from its last periodic checkpoint
            assert resume["from_step"] <= step and "reason" not in resume, resumes
    row = rows[job_id]
    assert job["attempts"] == row.attempts == 1 and row.preemptions == 0
    assert row.spent_seconds >= sum(float(ran) for ran in delivered) - 0.1 * len(delivered)

    # The same job on the fault stack's workers (RabbitMQ's 30 min timeout): no hand-back.
    twins = Scenario("F24 twin", stack, sc.key)
    twin = twins.submit(model="tiny", cache=False, **JOB)
    assert twin is not None
    assert twins.settle(180)[twin].status == JobStatus.SUCCEEDED
    images = []
    for api_url, done in ((private.api.url, job_id), (stack.api.url, twin)):
        made = _job(api_url, sc.key, done)["result"]["images"]
        images.append([requests.get(image["url"], timeout=30).content for image in made])
    assert "resumes" not in _job(stack.api.url, sc.key, twin)["result"]["manifest"]
    assert len(images[0]) == 4 and images[0] == images[1]


def test_a_jobs_budget_across_deliveries_fails_it_with_timeout_once_spent(fault_stack, private):
    """`tiny-budget`'s soft_time_limit of 6 s is running seconds over all deliveries: the
    first delivery hands the job back after about 4 s, the second spends the rest and the
    job fails with `timeout`, its message the one a single delivery's limit gives."""
    stack = fault_stack
    sc = Scenario("budget across deliveries", stack, stack.new_key(), private.api.url)
    job_id = sc.submit(model="tiny-budget", **JOB)
    assert job_id is not None, sc.figures.line()
    rows = sc.settle(120)
    row = rows[job_id]
    job = _job(private.api.url, sc.key, job_id)
    hand_backs = private.hand_backs(job_id)
    print(f"\nhanded back {hand_backs}; {row.spent_seconds:.2f} s before the last delivery")
    assert row.status == JobStatus.FAILED, (row.status, private.worker.log()[-3000:])
    assert job["error"] == {
        "code": "timeout",
        "message": "the job exceeded its time limit of 6s",
    }
    assert len(hand_backs) >= 1
    assert 0 < row.spent_seconds < 6
    assert job["attempts"] == 1
    assert private.closed_channels() == []
    fig = sc.count(rows)
    assert fig.failed == {"timeout": 1} and fig.duplicate_terminal == 0, fig.line()
