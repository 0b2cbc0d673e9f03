"""Metrics and the live dashboard against a live cluster: a real scheduler with
--http-listen, a real helper process with its own --http-listen, real TensorFlow jobs,
scraped over HTTP; the dashboard rendered by a real headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from tests.in_process import run_gandiva

pytestmark = [pytest.mark.tf, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def get(address: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as r:
        return r.read()


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(get(address, "/metrics").decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(address: str) -> set[str]:
    """The metric names /metrics declares (histograms with their _bucket/_count/_sum),
    including labelled metrics that have no series yet."""
    out = set()
    for family in text_string_to_metric_families(get(address, "/metrics").decode()):
        out.add(family.name)
        if family.type == "histogram":
            out |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum")}
        elif family.type == "counter":
            out.add(family.name + "_total")
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum over the samples of `name` whose labels include `labels` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def helper_http(cluster, name: str) -> str:  # type: ignore[no-untyped-def]
    log = cluster.tmp / f"helper-{name}.log"

    def found() -> str | None:
        m = re.search(r"metrics on http://(\S+)/metrics", log.read_text())
        return m.group(1) if m else None

    return cluster.wait_for(found, 30)


def submit(cluster, mlp, name: str, steps: int, total: int = 0, sleep: float = 0.02) -> str:  # type: ignore[no-untyped-def]
    spec = common_pb2.JobSpec(name=name, command=mlp(steps, sleep), workdir=str(cluster.tmp), gpus=1, steps=total)
    return cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id


def test_metrics_follow_a_time_sliced_cluster(observed_cluster, mlp) -> None:  # type: ignore[no-untyped-def]
    c = observed_cluster
    c.add_helper("node-a", 2, "--http-listen", "127.0.0.1:0", "--sample-interval", "0.5", "--log-format", "json")
    http, helper = c.sched.server.http_address, helper_http(c, "node-a")

    before = scrape(http)
    assert value(before, "gandiva_server_gpus", server="node-a") == 2
    assert value(before, "gandiva_server_height", server="node-a") == 0
    assert value(before, "gandiva_jobs", state="running") == 0
    assert value(scrape(helper), "gandiva_helper_jobs_running", server="node-a") == 0

    # Three one-GPU jobs on two GPUs: one GPU is time-sliced.
    # Each long enough (10 s of steps) that none ends before the shared GPU's first switch,
    # however slowly the three TensorFlow processes start.
    ids = [submit(c, mlp, f"job-{i}", 500) for i in range(3)]
    # A scrape taken while the GPU is shared: after the first suspend and before any job ends.
    during = c.wait_for(lambda: (s := scrape(http)) and
                        value(s, "gandiva_switch_seconds_count", command="suspend") >= 1 and
                        value(s, "gandiva_server_height", server="node-a") == 2 and s, 120)
    assert value(during, "gandiva_server_gpus_oversubscribed", server="node-a") == 1
    assert value(during, "gandiva_server_gpus_allocated", server="node-a") == 2
    assert value(during, "gandiva_decisions_total", kind="place") == 3
    assert value(during, "gandiva_decisions_total", kind="suspend") >= 1
    assert value(during, "gandiva_jobs", state="running") + value(during, "gandiva_jobs", state="suspended") == 3
    assert value(during, "gandiva_rpc_seconds_count", method="/gandiva.v1.Scheduler/SubmitJob", code="OK") == 3
    assert value(during, "gandiva_policy_decision_seconds_count") > 0
    assert value(during, "gandiva_db_transaction_seconds_count", mode="write") > 0
    # A user watching the rates sees the running jobs move.
    rated = c.wait_for(lambda: {ls for (n, ls), v in scrape(http).items()
                                if n == "gandiva_job_minibatch_rate" and v > 0}, 60)
    assert {dict(ls)["job"] for ls in rated} <= set(ids)
    on_helper = c.wait_for(lambda: (s := scrape(helper)) and
                           value(s, "gandiva_helper_jobs_running", server="node-a") >= 2 and s, 60)
    assert value(on_helper, "gandiva_helper_gpu_memory_used_bytes", server="node-a") > 50 << 20
    assert value(on_helper, "gandiva_helper_gpu_memory_total_bytes", server="node-a", gpu="0") > 0
    assert value(on_helper, "gandiva_helper_info", backend="cpu") == 1
    assert value(on_helper, "gandiva_helper_host_memory_bytes", server="node-a") > 1 << 30  # this machine's
    # The jobs' processes hold host memory (TensorFlow: hundreds of MB each), measured per report.
    c.wait_for(lambda: value(scrape(helper), "gandiva_helper_jobs_host_memory_bytes", server="node-a") > 200 << 20, 30)

    c.wait_for(lambda: all(c.job(j).state == common_pb2.JOB_STATE_SUCCEEDED for j in ids), 240)
    after = scrape(http)
    assert value(after, "gandiva_jobs", state="succeeded") == 3
    assert value(after, "gandiva_jobs", state="running") == 0
    assert value(after, "gandiva_server_height", server="node-a") == 0
    assert value(after, "gandiva_switch_seconds_count", command="resume") >= 1
    assert value(after, "gandiva_job_minibatch_rate") == 0  # no running job, no per-job series
    c.wait_for(lambda: value(scrape(helper), "gandiva_helper_jobs_running", server="node-a") == 0, 30)

    # The helper logged JSON lines; each line about one of the jobs names it, each about a command names that.
    logged = [json.loads(x) for x in (c.tmp / "helper-node-a.log").read_text().splitlines() if x.startswith("{")]
    about_jobs = [x for x in logged if any(j in x["msg"] for j in ids)]
    assert {x["job_id"] for x in about_jobs} == set(ids)
    launches = [x for x in about_jobs if x["msg"].startswith("command ")]
    assert len(launches) >= 3 and all(x["command_id"] in x["msg"] for x in launches)

    # Every metric the Grafana dashboard and the alerting rules in docs/ query is one the cluster exports.
    rules = yaml.safe_load((Path(__file__).parents[2] / "docs" / "alerts.yml").read_text())["groups"][0]["rules"]
    assert all({"alert", "expr", "for"} <= set(rule) for rule in rules), rules
    for doc in ("grafana-dashboard.json", "alerts.yml"):
        queried = set(re.findall(r"gandiva_\w+", (Path(__file__).parents[2] / "docs" / doc).read_text()))
        assert queried <= families(http) | families(helper), (doc, queried - families(http) - families(helper))

    # gandiva top shows the servers and the jobs with the reason of the last decision.
    top = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "top", "--http", http, "--once", "--all"],
                         capture_output=True, text=True, timeout=60, check=True, env={**os.environ, "COLUMNS": "200"})
    assert "node-a" in top.stdout and all(j in top.stdout for j in ids)
    assert "succeeded" in top.stdout and "time-slice" in top.stdout

    # The dashboard's JSON tells the same story: the decisions with their reasons, the timeline.
    decisions = json.loads(get(http, "/api/decisions?after=0"))["decisions"]
    assert [d["kind"] for d in decisions].count("place") == 3
    assert any(d["kind"] == "suspend" and d["reason"] for d in decisions)
    timeline = json.loads(get(http, "/api/timeline"))
    assert set(timeline["gpus"]) == {"node-a/0", "node-a/1"}
    shared = [s for segs in timeline["gpus"].values() for s in segs if s["waiting"]]
    assert shared, "a time-sliced GPU shows its waiting job"
    assert set(timeline["jobs"]) == set(ids)


def chromium_dom(url: str, budget_ms: int = 6000) -> str:
    """The page's DOM after its scripts ran, from a real headless Chromium."""
    profile = tempfile.mkdtemp(prefix="gandiva-chromium-")
    try:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=90, check=True)
        return out.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        reason = "no chromium on PATH (apt-get install -y chromium)"
        if os.environ.get("GANDIVA_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return CHROMIUM


def test_dashboard_shows_servers_and_jobs_in_a_browser(observed_cluster, mlp, chromium) -> None:  # type: ignore[no-untyped-def]
    c = observed_cluster
    c.add_helper("node-a", 1, "--host-memory", "8GiB")
    c.add_helper("node-b", 1, "--host-memory", "0")
    # Two give their total mini-batches at submission (--steps); the third's program says
    # where it stops itself (MonitoredTrainingSession, StopAtStepHook(last_step=2000)).
    # 0.2 s a step: none ends before the page is read, however slowly this test's commands
    # and browser run (nor, before s51, reached step 1,103, where mts_mlp's loss turned NaN).
    # At 0.02 s, at load 18-22, the page showed ['running', 'idle'] or ['running', 'running']:
    # one job done, the mts one failed (NaN loss), the shared GPU shared no more.
    ids = [submit(c, mlp, f"shown-{i}", 2000, total=2000, sleep=0.2) for i in range(2)]
    mts = importlib.util.find_spec("tf_runtime.examples.mts_mlp").origin  # type: ignore[union-attr]
    ids.append(c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="shown-2", command=["python", str(mts), "--steps", "2000", "--step-sleep", "0.2"],
        workdir=str(c.tmp), gpus=1))).job.id)
    c.wait_for(lambda: sum(c.job(j).state == common_pb2.JOB_STATE_RUNNING for j in ids) == 2, 120)
    c.wait_for(lambda: all(c.job(j).steps > 0 for j in ids if c.job(j).state == common_pb2.JOB_STATE_RUNNING), 120)
    program = c.wait_for(lambda: (j := c.job(ids[2])).total_steps_from == "program" and j, 60)
    assert program.total_steps == 2000
    # Progress and ETA, with what the ETA assumes on the shared GPU (no made-up ones).
    shared = c.wait_for(lambda: [j for j in ids if re.search(
        r"time-slices GPU node-\w/0 with 1 other job|packed beside 1 other job\(s\) on GPU node-", c.job(j).eta_note)], 60)
    described = gandiva_cli(c, "describe", "job", shared[0])
    assert re.search(r"Steps: +step [\d,]+ / 2,000 \(\d+%; ", described), described
    assert re.search(r"ETA: +~\d+(s| min|h\d\d|d\d\dh) \(.*(time-slices|packed beside)", described), described
    listed = gandiva_cli(c, "get", "jobs")
    assert re.search(r" \d+%/(\d+[smhd]\d*h?|\?) ", listed) and all(len(line) <= 80 for line in listed.splitlines()), listed

    dom = chromium_dom(f"http://{c.sched.server.http_address}/")
    assert len(re.findall(r">step [\d,]+ / 2,000 \(\d+%\)<", dom)) == 3, dom
    assert re.search(r'<td class="eta">~\d+(s| min|h\d\d|d\d\dh) \(', dom), dom
    for server in ("node-a", "node-b"):
        assert f'data-server="{server}"' in dom
    # Host memory held by each server's jobs, of what its helper reported (none: unknown).
    assert re.search(r"host memory \d+\.\d / 8\.0 GiB", dom), dom
    assert re.search(r"host memory \d+\.\d / \? GiB \(not reported\)", dom), dom
    for i, job_id in enumerate(ids):
        assert f'data-job="{job_id}"' in dom and f"shown-{i}" in dom
    # One server shares its GPU between two jobs (taking turns, or packed on trial), and the page says so.
    modes = re.findall(r'<span class="mode">([^<]+)</span>', dom)
    assert sorted(modes) in (["running", "time-sliced"], ["packed", "running"]), modes
    assert '<div id="error" class="bad"></div>' in dom  # no "cannot reach the scheduler"
    for j in ids:
        c.stub.KillJob(scheduler_pb2.JobActionRequest(id=j))


def test_top_without_a_scheduler_says_what_to_do() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GANDIVA_HTTP"}
    missing = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "top", "--once"],
                             capture_output=True, text=True, timeout=60, check=False, env=env)
    assert missing.returncode == 2 and "--http-listen" in missing.stderr
    down = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "top", "--once", "--http", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert down.returncode == 1 and "is the scheduler running with --http-listen" in down.stderr


@pytest.mark.parametrize(("option", "error"), [
    ("nope=1", "KEY one of"), ("pack_trial_s", "KEY=VALUE"), ("pack_trial_s=soon", "not a float"),
    ("enable_packing=maybe", "not a bool"), ("max_jobs_per_gpu=0", "at least 1"),
    ("gather_large=true", "does not launch jobs over several servers"),
])
def test_bad_policy_options_are_named(option: str, error: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0",
         "--db", f"sqlite+aiosqlite:///{tmp_path}/x.db", "--policy-option", option],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and error in run.stderr, run.stdout + run.stderr


def test_policy_options_reach_the_policy() -> None:
    from scheduler.cli.serve import policy_options
    from scheduler.policy.types import PolicyConfig

    options = ["pack_trial_s=10", "enable_grow_shrink=false", "reserve_after_s=none", "max_jobs_per_gpu=2"]
    config = PolicyConfig(quantum_s=6, **policy_options(options))
    assert (config.pack_trial_s, config.enable_grow_shrink, config.reserve_after_s, config.max_jobs_per_gpu) == \
        (10.0, False, None, 2)


async def test_http_errors_name_what_to_do() -> None:
    from scheduler.observe.http import HttpServer, Response

    async def hello(_):  # type: ignore[no-untyped-def]
        return Response(200, b"hi")

    server = HttpServer("127.0.0.1:0", {"/hello": hello})
    address = await server.start()
    try:
        import asyncio

        def fetch(path: str, method: str = "GET") -> tuple[int, str]:
            req = urllib.request.Request(f"http://{address}{path}", method=method)
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as err:
                return err.code, err.read().decode()

        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, fetch, "/hello") == (200, "hi")
        status, body = await loop.run_in_executor(None, fetch, "/nope")
        assert status == 404 and "/hello" in body
        status, body = await loop.run_in_executor(None, fetch, "/hello", "POST")
        assert status == 405 and "GET" in body
    finally:
        await server.stop()
    with pytest.raises(ValueError, match="HOST:PORT"):
        HttpServer("9100", {})

def gandiva_cli(cluster, *args: str) -> str:  # type: ignore[no-untyped-def]
    out = subprocess.run([sys.executable, "-m", "gandiva_cli.main", *args, "--scheduler", cluster.sched.address],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


VERDICT = re.compile(
    r"packing trial with (j-\w+): packed rate (\d+\.\d\d)x of time-slicing(?:: kept| is no gain) "
    r"\((j-\w+) ([\d.]+) packed vs ([\d.]+) alone, (j-\w+) ([\d.]+) vs ([\d.]+) mini-batches/s; measured over")


def test_describe_says_whether_a_pack_helped_with_the_measured_rates(policy_cluster, mlp) -> None:  # type: ignore[no-untyped-def]
    """A packing trial's verdict (kept, or undone) was only in the dashboard's in-memory
    log: `describe job` and `get events` showed the pack start ("trial: utilization 0.05 +
    0.05", naming no partner) and then nothing, so "did packing help?" had no answer
    there. Now both jobs' histories carry the verdict with the rates it was judged by."""
    c = policy_cluster(quantum_s=1.5, pack_trial_s=4.0)
    c.add_helper("node-a", 1, "--sample-interval", "0.5")
    ids = [c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name=f"pk-{i}", command=mlp(100000, 0.02), workdir=str(c.tmp), gpus=1))).job.id for i in range(2)]

    rates: list[float] = []

    def verdicts(job_id: str) -> list[str]:
        rates.append(c.job(job_id).rate)
        events = c.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
        assert all(e.server == "node-a" for e in events if e.kind == "job.pack"), events
        return [e.message for e in events if e.kind == "job.pack"]

    c.wait_for(lambda: all(verdicts(j) for j in ids), 150)
    # 20 ms of Python between runs: at most 50 mini-batches/s, also just after a start or a
    # resume (the first interval after a pause used to be the run alone: hundreds per second,
    # and the trial was judged against that).
    assert 0 < max(rates) <= 51, rates
    histories: list[list[str]] = []
    for job_id in ids:
        text = gandiva_cli(c, "describe", "job", job_id)
        other = ids[1 - ids.index(job_id)]
        m = VERDICT.search(text)
        assert m, text
        assert m[1] == other and {m[3], m[6]} == set(ids)
        # The ratio shown is the one the rates shown give (each rounded to 3 digits), each
        # job's packed/alone clipped at 1 (9c1d899: no job runs faster packed than alone; a
        # noisy "alone" rate, 47 packed vs 33.4 alone, once showed 2.00x, not 2.44x).
        gain = min(float(m[4]) / float(m[5]), 1.0) + min(float(m[7]) / float(m[8]), 1.0)
        assert abs(gain - float(m[2])) < 0.02 * gain, text
        # One timeline in its History: the verdict among the state changes, after the
        # trial's start (it was only among the last 20 events, pushed out by time slices).
        history = text.split("History:\n", 1)[1].split("\nEvents (last", 1)[0].splitlines()
        verdict_at = next(i for i, line in enumerate(history) if "(verdict)" in line and "packing trial with" in line)
        histories.append(history[:verdict_at])
    # (The job packed in has the trial's start before it; its partner ran on meanwhile.)
    assert any("trial: packed beside" in line for before in histories for line in before), histories
    # A running job suspended or moved says the rate it ran at then, as measured then (none
    # when no report came since it started: here the pack may come before any; that a rate
    # is said is checked in test_runtime_api.py -k progress_and_operator).
    ran = [float(m) for j in ids for t in c.job(j).history for m in re.findall(r"\(it ran ([\d.]+) mini-batches/s\)",
                                                                               t.reason)]
    assert all(0 < r <= 51 for r in ran), [t.reason for j in ids for t in c.job(j).history]
    # The pack itself names the job it was packed beside.
    reasons = [t.reason for j in ids for t in c.job(j).history]
    assert any(re.fullmatch(r"trial: packed beside j-\w+, utilization [\d.]+ \+ [\d.]+ \(step \d+\)", r)
               for r in reasons), reasons
    for j in ids:
        c.stub.KillJob(scheduler_pb2.JobActionRequest(id=j))


HOSTILE = '<img src=x onerror="document.body.dataset.xss=1">'


def test_gpu_time_per_job_and_user_matches_what_ran(observed_cluster, chromium) -> None:  # type: ignore[no-untyped-def]
    """"Who uses the GPUs, and how much GPU time did each get?" had no answer: no GPU time
    in `describe`, `get`, the dashboard or /metrics. Now each job's GPU time (seconds
    running x GPUs) is in `describe job`, `get jobs -o wide`, `get users` (per user),
    the dashboard's jobs table and gandiva_user_gpu_seconds, and it matches the time the
    job has really been running. Hostile names and users render as text in a browser."""
    c = observed_cluster
    c.add_helper("node-a", 2)

    def submit(name: str, user: str, gpus: int) -> str:
        spec = common_pb2.JobSpec(name=name, user=user, command=["sleep", "600"], workdir=str(c.tmp), gpus=gpus)
        return c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id

    alice, bob = submit("a", "alice", 1), submit("b", "bob", 1)
    c.wait_for(lambda: all(c.job(j).state == common_pb2.JOB_STATE_RUNNING for j in (alice, bob)), 60)
    queued = submit(HOSTILE, "<b>mallory</b>", 2)  # 2 GPUs on a server of 1-GPU jobs: waits
    c.wait_for(lambda: c.job(queued).message, 30)
    since = {j: c.job(j).history[-1].at for j in (alice, bob)}  # when each started running
    c.wait_for(lambda: time.time() - max(since.values()) > 2, 10)

    before = time.time()
    described = gandiva_cli(c, "describe", "job", alice)
    users = gandiva_cli(c, "get", "users")
    samples = scrape(c.sched.server.http_address)
    after = time.time()
    shown = re.search(r"GPU time: +(\d+)s \(time training x GPUs: running, and moving while it trained on at its "
                      r"source\)", described)
    assert shown, described
    assert before - since[alice] - 1 <= int(shown[1]) <= after - since[alice] + 1, described
    rows = {line.split()[0]: line.split() for line in users.splitlines()[1:]}
    assert users.split()[:7] == ["USER", "RUNNING", "SUSPENDED", "QUEUED", "FINISHED", "GPUS-RUNNING", "GPU-TIME"]
    assert rows["alice"][1:6] == ["1", "0", "0", "0", "1"] and rows["bob"][1:6] == ["1", "0", "0", "0", "1"], users
    assert rows["<b>mallory</b>"][1:] == ["0", "0", "1", "0", "0", "0s"], users
    for user in ("alice", "bob"):
        used = value(samples, "gandiva_user_gpu_seconds", user=user)
        assert before - since[alice if user == "alice" else bob] - 1 <= used <= after - min(since.values()) + 1
        assert value(samples, "gandiva_user_gpus_running", user=user) == 1
    assert value(samples, "gandiva_user_gpus_running", user="<b>mallory</b>") == 0
    # What an operator alerts on (session 49): how long jobs waited for their first start (a
    # histogram: percentiles by histogram_quantile), the two started, the queued one not yet;
    # the helper up (it goes to 0 below, when it is killed).
    assert value(samples, "gandiva_queue_wait_seconds_count") == 2, samples
    waited = max(since.values()) - min(c.job(j).submitted_at for j in (alice, bob))
    assert 0 <= value(samples, "gandiva_queue_wait_seconds_sum") <= 2 * waited + 1, samples
    assert value(samples, "gandiva_server_up", server="node-a") == 1
    # `gandiva top --once` into a file: every job's row whole, its last decision's reason included
    # (at the 80 columns assumed for a pipe, that column used to get no room at all).
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    top = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "top", "--http", c.sched.server.http_address,
                          "--once"], capture_output=True, text=True, timeout=60, check=True, env=env).stdout
    assert re.search(rf"{alice} .* place: Algorithm 1: \w+", top), top
    wide = gandiva_cli(c, "get", "jobs", alice, "-o", "wide")
    assert "GPU-TIME" in wide.splitlines()[0] and re.search(r" \d+s ", wide.splitlines()[1]), wide

    # What needs a person, after a real fault: the helper killed (nothing said so but a "no" in
    # `get servers`' UP column). `gandiva get problems` and the page's list
    # name it with the command to run next; before it, nothing is listed. (The CLI's JSON and
    # a job's repeated failures: tests/scheduler/cli/test_cli_problems.py.)
    def problems() -> list:
        return list(c.stub.ListProblems(scheduler_pb2.ListProblemsRequest()).problems)

    assert problems() == []
    c.helpers[0].kill()
    down = c.wait_for(lambda: [p for p in problems() if p.kind == "server.down"], 60)
    assert down[0].subject == "node-a" and down[0].next.startswith("restart gandiva helper on node-a")
    assert value(scrape(c.sched.server.http_address), "gandiva_server_up", server="node-a") == 0
    table = gandiva_cli(c, "get", "problems")
    assert table.split()[:5] == ["KIND", "SUBJECT", "SINCE", "WHAT", "NEXT"] and re.search(r"server\.down +node-a ", table), table

    dom = chromium_dom(f"http://{c.sched.server.http_address}/")
    box = re.search(r'<div id="problems-box">(.*?)</div>', dom, re.DOTALL)
    assert box and '<tr data-kind="server.down"><td class="id">server.down</td><td class="id">node-a</td>' in box[1], dom
    assert "<code>restart gandiva helper on node-a" in box[1], box[1]
    row = re.search(rf'<tr data-job="{alice}">(.*?)</tr>', dom)
    # Its GPU time as the page writes a duration (45s, 5m12s, ...): past a minute on a loaded machine.
    assert row and re.search(r'<td class="num">(\d+[dhm])?\d+[smh]</td><td[^>]*>alice</td>', row[1]), dom
    # The hostile name and user are text on the page; nothing of them ran or became markup.
    assert "data-xss" not in dom and "<b>mallory" not in dom, dom
    assert "&lt;img src=x onerror=" in dom and "&lt;b&gt;mallory&lt;/b&gt;" in dom, dom
    for j in (alice, bob, queued):
        c.stub.KillJob(scheduler_pb2.JobActionRequest(id=j))


def test_describe_says_why_a_suspended_job_waits_and_a_held_job_outlives_its_server(policy_cluster, mlp, capsys) -> None:  # type: ignore[no-untyped-def]
    """"Why is my job not running?" for a suspended job: held by an operator (until
    `gandiva resume`), or waiting its turn and who runs meanwhile; the rate of a job not
    running is not shown as its pace. A held job whose server went down was requeued
    still held, out of the policy's reach and refused by `gandiva resume` (not suspended):
    it waited in the queue for good, saying only "its server node-a went down"."""
    c = policy_cluster(quantum_s=1.5, enable_packing=False)
    c.add_helper("node-a", 1)

    def submit(name: str) -> str:
        return c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name=name, command=mlp(100000, 0.02), workdir=str(c.tmp), gpus=1))).job.id

    held = submit("held")
    c.wait_for(lambda: c.job(held).steps > 100, 120)
    steps_before = c.stub.SuspendJob(scheduler_pb2.JobActionRequest(id=held, reason="maintenance window")).steps
    text = gandiva_cli(c, "describe", "job", held)
    assert f"Waiting:     held by an operator: it stays suspended until `gandiva resume {held}`" in text, text
    assert re.search(r"Rate: +- \([\d.]+ mini-batches/s when it last ran\)", text), text
    row = gandiva_cli(c, "get", "jobs", held, "--no-headers").split()
    assert row[2] == "SUSPENDED" and row[6] == "-", row  # RATE: no pace while suspended
    # Every state change names its server (a suspend's event had none): events by server.
    on_a = gandiva_cli(c, "get", "events", "--server", "node-a", "--kind", "job.state", "--no-headers")
    assert [line.split()[4:8] for line in on_a.splitlines()] == [
        ["node-a", "QUEUED", "->", "RUNNING:"], ["node-a", "RUNNING", "->", "SUSPENDED:"]], on_a

    c.add_helper("node-b", 1)
    other = submit("other")
    c.helpers[0].kill()  # node-a's helper dies; its held job is requeued
    c.wait_for(lambda: any("the operator's hold ends" in t.reason for t in c.job(held).history), 60)
    # Started over without a checkpoint: its step count with it, not the lost process's count
    # frozen until the new one passes it.
    restarted = c.wait_for(lambda: [t.reason for t in c.job(held).history if "no checkpoint: it starts over" in t.reason], 60)
    assert f"its step count with it (it was at {steps_before})" in restarted[0]
    again = c.job(held)
    assert again.steps < steps_before  # read at once: TensorFlow takes seconds to start again
    # Its metrics are the lost process's no more: the page and describe showed "step 0 /
    # 4,000" beside the loss of step 291 (`gandiva demo --keep`, a helper killed -9; s53).
    assert "loss" not in again.metrics or again.steps > 0, (again.steps, dict(again.metrics))
    # Placed again (on node-b, taking turns with the other job), not left in the queue.
    c.wait_for(lambda: c.job(held).state in (common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED)
               and c.job(other).steps > 0 and c.job(held).steps > 0, 120)

    # One describe's own view (its job, then who runs on its GPUs), run in this process:
    # a `gandiva` process took 5-7 s to start and answer on a loaded machine, 4 slices of
    # 1.5 s, so its job was seldom still suspended when the peer was asked about after it
    # (CI of 39a0368: none in 30 s), or its own view straddled a turn ("nothing runs there").
    def suspended_text() -> str | None:
        for j, peer in ((held, other), (other, held)):
            out = run_gandiva(capsys, "describe", "job", j, "--scheduler", c.sched.address)
            assert out.returncode == 0, out.stderr
            text = out.stdout.replace(peer, "PEER").replace(j, "SELF")
            if "State:       SUSPENDED" in text and re.search(
                    r"Waiting: +its turn on node-b:0, time-slicing with 1 other job\(s\); running there now: "
                    r"(held|other) \(PEER\)", text):
                return text
        return None

    c.wait_for(suspended_text, 30)
    for j in (held, other):
        c.stub.KillJob(scheduler_pb2.JobActionRequest(id=j))


def test_describe_of_a_failed_job_shows_its_last_output(cluster) -> None:  # type: ignore[no-untyped-def]
    """"Why did my job fail?": describe said only "failed with exit code 1"; the error was
    in the log, for those who knew `gandiva logs`. Now it shows the job's last lines
    (escaped as text) and names the command for all of it."""
    c = cluster
    c.add_helper("node-a", 1)
    program = ("import sys\nfor i in range(3000): print('line', i)\n"
               "print('\\x1b[31mred\\x1b[0m')\nsys.exit('FileNotFoundError: /data/imagenet is missing')")
    job = c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="crasher", command=["python", "-c", program], workdir=str(c.tmp), gpus=1))).job.id
    c.wait_for(lambda: c.job(job).state == common_pb2.JOB_STATE_FAILED, 60)
    text = gandiva_cli(c, "describe", "job", job)
    tail = text.split(f"Last output (all of it: gandiva logs {job}):\n", 1)[1].split("History:", 1)[0]
    assert tail.splitlines() == [f"  line {i}" for i in range(2992, 3000)] + [
        "  \\x1b[31mred\\x1b[0m", "  FileNotFoundError: /data/imagenet is missing"], text
