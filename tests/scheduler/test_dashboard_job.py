"""The dashboard's per-job timeline (http://HOST:PORT/#job=ID, or a click on a job's id), in a
real headless Chromium against a real scheduler (gRPC, SQLite, its HTTP port; the test answers
for the helper and the job's runtime): the job's decisions in time order, each with its reason,
the rate it ran at before each suspend, and its packing verdicts. Before, the page had no view
of one job: only its last decision, and the cluster's latest 30."""

from __future__ import annotations

import datetime
import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from gandiva_cli import main as gandiva_main
from protos.gandiva.v1 import common_pb2, scheduler_pb2

from ..integration.test_observe import chromium, chromium_dom
from .api.test_fencing import Fake
from .api.test_runtime_api import FakeShim

assert chromium  # a fixture: skips (or fails under GANDIVA_REQUIRE_BROWSER=1) without one

RUNNING = common_pb2.JOB_STATE_RUNNING


def _get(address: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_jobs_decisions_with_reasons_and_rates_are_shown_on_the_page(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, chromium: str, capsys: Any) -> None:
    from scheduler.state import repo

    sched = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0")
    f = Fake(sched.address, gpus={"a": 1})
    try:
        f.keep_alive("a")
        job_id = f.submit()
        _, launch = f.launched(job_id, wait_for)
        shim = FakeShim(f.ch, job_id, launch.incarnation)
        f.shims.append(shim)
        wait_for(lambda: f.job(job_id).state == RUNNING, 20)
        shim.progress(10, 4.5)
        wait_for(lambda: f.job(job_id).rate == pytest.approx(4.5))
        f.api.SuspendJob(scheduler_pb2.JobActionRequest(id=job_id, reason="make way"))
        f.api.ResumeJob(scheduler_pb2.JobActionRequest(id=job_id))
        # A packing verdict as the scheduler records it (a job.pack event of each job of the pair).
        verdict = ("packing trial with j-0other: packed rate 1.62x of time-slicing: kept (j-x 15.8 packed vs "
                   "19.5 alone, j-0other 15.7 vs 19.4 mini-batches/s; measured over 4.5s)")

        async def add_verdict() -> None:
            async with sched.server.core.tx() as s:
                repo.add_event(s, time.time(), "job.pack", verdict, job_id=job_id, server="a")
        sched.call(add_verdict())

        address = sched.server.http_address
        status, body = _get(address, f"/api/job?id={job_id}")
        assert status == 200, body
        kinds = [(r["kind"], r["to"]) for r in body["timeline"]]
        assert kinds == [("state", "QUEUED"), ("state", "RUNNING"), ("state", "SUSPENDED"), ("state", "RUNNING"),
                         ("verdict", "")], body
        assert body["timeline"][2]["reason"] == "make way (step 42) (it ran 4.5 mini-batches/s)", body
        # Bad or unknown ids are said as such, not a 500.
        assert _get(address, "/api/job?id=j-nosuchjob")[0] == 404
        assert _get(address, "/api/job?id=%3Cscript%3E")[0] == 400
        assert _get(address, "/api/job")[0] == 400

        dom = chromium_dom(f"http://{address}/#job={job_id}", budget_ms=5000)
        panel = dom.split('id="job-panel"', 1)[1].split("</table>", 1)[0]
        assert "hidden" not in panel.split(">", 1)[0], panel[:300]
        assert job_id in panel and "QUEUED → RUNNING" in panel and "RUNNING → SUSPENDED" in panel, panel
        assert "make way (step 42) (it ran 4.5 mini-batches/s)" in panel, panel
        assert "packing verdict" in panel and "packed rate 1.62x of time-slicing: kept" in panel, panel
        # What sharing did to it, in one line (session 48; as describe's Sharing section).
        assert "Sharing: running " in panel and "(1 suspension)" in panel, panel
        assert "packing: kept at 1.62x of time-slicing" in panel and "moves: none" in panel, panel
        # Where it ran (session 49, the GPUs' history): GPU 0 of server a, held still.
        assert "GPUs held: a/0 " in panel and "–now</div>" in panel, panel
        assert [(p["server"], p["gpu"], p["end_at"]) for p in body["placements"]] == [("a", 0, None)], body
        # The job's id in the jobs table links to it.
        assert f'href="#job={job_id}"' in dom
        # How the GPU's time was spent (session 52): it ran, was held a moment, ran again.
        spent = _get(address, "/api/state")[1]["gpu_time"]
        assert spent["training"] > 0 and spent["seen"] == pytest.approx(sum(
            spent[k] for k in ("training", "packed", "suspended", "moving", "idle"))), spent
        assert "GPU time over the last " in dom and "training " in dom.split('id="gpu-time"', 1)[1][:300], dom
        # GPU time by user over the last day (session 48), drawn from /api/usage: one user, one job.
        status, used = _get(address, "/api/usage")
        assert status == 200 and [(u["user"], u["jobs"], u["started"]) for u in used["users"]] == [("", 1, 1)], used
        assert used["users"][0]["gpu_seconds"] > 0, used
        table = dom.split('id="usage"', 1)[1].split("</table>", 1)[0]
        assert table.count('<tr data-user=""') == 1 and 'class="bar"' in table, table
        # Ended, its row says how (its message), not the last decision taken while it ran
        # (`place: ...` here; `suspend: time slice of 10s over` for a job SUCCEEDED in the demo).
        f.api.KillJob(scheduler_pb2.JobActionRequest(id=job_id, reason="enough"))
        killed_at = time.time()
        row = next(j for j in _get(address, "/api/state")[1]["jobs"] if j["id"] == job_id)
        assert row["state"] == "KILLED" and row["last_decision"] is None and "enough" in row["message"], row
        # `gandiva describe job` sums up what sharing did to it (session 48), from the same events.
        capsys.readouterr()
        assert gandiva_main.main(["describe", "job", job_id, "--scheduler", sched.address, "-o", "json"]) == 0
        described = json.loads(capsys.readouterr().out)
        shared = described["sharing"]
        # Where it ran (session 49): GPU 0 of a, from its placement to its kill.
        assert [(p["server"], p["gpu"]) for p in described["gpus_held"]] == [("a", 0)], described["gpus_held"]
        assert described["gpus_held"][0]["end_at"] == pytest.approx(killed_at, abs=1)
        # Why it was suspended and what followed (session 52): the operator's reason, its resume.
        assert [(d["decision"], d["why"], d["outcome"].split(" ")[0], d["rate_before"])
                for d in described["decisions"]] == [("suspend", "make way (step 42)", "resumed", 4.5)], described
        assert gandiva_main.main(["describe", "job", job_id, "--scheduler", sched.address]) == 0
        said = capsys.readouterr().out
        assert "\nGPUs held: a/0 " in said
        assert "\nWhy it was suspended, moved or queued again" in said and "make way (step 42)" in said, said
        assert (shared["time_slices"], shared["rates_before_switch"]) == (1, [4.5]), shared
        assert [(t["verdict"], t["gain"]) for t in shared["packing_trials"]] == [("kept", 1.62)], shared
    finally:
        f.close()
    # After a restart the page's decision log was empty (it lives in memory); since session 48
    # the latest decisions are read back from the database's state changes and verdicts.
    sched.stop()
    restarted = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0")
    again = restarted.server.http_address
    log = _get(again, "/api/decisions?after=0")[1]["decisions"]
    assert [(d["kind"], d["job"]) for d in log] == [("place", job_id), ("suspend", job_id), ("resume", job_id),
                                                    ("keep-pack", job_id), ("restart", "")], log
    assert log[1]["reason"] == "make way (step 42) (it ran 4.5 mini-batches/s)", log
    assert "read back from the database" in log[-1]["reason"], log  # the page's log shows these (the page is unchanged)
    # Since session 49 with their GPUs, and the per-GPU timeline drawn again (both were empty:
    # a state change names no GPU), from the GPUs' history (gpu_holds).
    assert [d["gpus"] for d in log[:3]] == [["a/0"]] * 3, log
    segs = _get(again, "/api/timeline")[1]["gpus"]["a/0"]
    assert [(s["running"], s["waiting"]) for s in segs] == [([job_id], []), ([], [job_id]), ([job_id], [])], segs
    assert segs[0]["t0"] == pytest.approx(log[0]["at"]) and segs[-1]["t1"] == pytest.approx(killed_at, abs=1), segs
    # "Which job was on GPU 0 of a while it was suspended, doing what?" from the command line.
    mid = datetime.datetime.fromtimestamp((log[1]["at"] + log[2]["at"]) / 2).isoformat()
    capsys.readouterr()
    assert gandiva_main.main(["get", "placements", "--at", mid, "--server", "a", "--gpu", "0",
                              "--scheduler", restarted.address, "-o", "json"]) == 0
    held = json.loads(capsys.readouterr().out)["placements"]
    assert [(p["job_id"], p["server"], p["gpu"], p["state_at"]) for p in held] == [(job_id, "a", 0, "suspended")]
    assert held[0]["start_at"] == pytest.approx(log[0]["at"]) and held[0]["end_at"] == pytest.approx(killed_at, abs=1)
    assert gandiva_main.main(["get", "placements", "--since", "1h", "--scheduler", restarted.address]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:3] == ["SERVER", "GPU", "JOB"] and table[2].split()[:3] == ["a", "0", job_id], table
    assert gandiva_main.main(["get", "placements", "--at", "1h", "--since", "2h", "--scheduler",
                              restarted.address]) == 2
    assert "--at names one instant" in capsys.readouterr().err
    assert gandiva_main.main(["get", "placements", "--at", "2099-01-01", "--scheduler", restarted.address]) == 2
    assert "is in the future; the GPUs' history holds only what has happened" in capsys.readouterr().err


def test_a_job_slower_than_its_own_rate_alone_is_shown_so(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, chromium: str, monkeypatch: Any, capsys: Any) -> None:
    """"Which jobs are slow compared with their own rate alone?" had no answer: the scheduler
    measures each job's rate alone (scheduler/alone.py, the baseline it judges packing by),
    and no view showed it. Now /api/state carries it and the rate against it; the page's
    rate cell (here in a real Chromium) says "0.1 (0.01x alone)" in red, `gandiva top` names the
    slow jobs in a line of their own, `get jobs -o wide` has VS-ALONE and `describe` its Rate line, and /metrics has gandiva_job_alone_minibatch_rate. The
    job's view (#job=ID) draws its rate over time against its rate alone (/api/job's `rates`)."""
    from rich.console import Console

    from scheduler.alone import SLOW_AGAINST_ALONE
    from scheduler.cli.top import render
    from scheduler.observe import metrics

    monkeypatch.setattr(metrics, "RATE_SAMPLE_S", 0.2)  # a sample a round (10 s: a chart of one point)

    sched = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0")
    http = sched.server.http_address
    f = Fake(sched.address, gpus={"a": 1})
    try:
        f.keep_alive("a")
        job_id = f.submit()
        _, launch = f.launched(job_id, wait_for)
        shim = f.shim(job_id, launch.incarnation)
        wait_for(lambda: f.job(job_id).state == RUNNING, 20)
        steps = [0]

        def shown(rate: float) -> dict[str, Any] | None:
            """Its row of /api/state once the scheduler has its rate alone and the job's
            reported `rate` is shown; meanwhile it trains on, 10 mini-batches a look."""
            steps[0] += 10
            shim.progress(steps[0], rate)
            (row,) = [j for j in _get(http, "/api/state")[1]["jobs"] if j["id"] == job_id]
            return row if row["alone_rate"] and row["rate"] == pytest.approx(rate) else None

        # Alone on its GPU (no neighbour), its runtime reporting a rate like its pace ...
        wait_for(lambda: shown(40.0), 30)
        # ... then a rate far under the pace it was measured at alone (the steps go on as before).
        row = wait_for(lambda: (r := shown(0.1)) and r["slow"] and r, 30)
        assert row["against_alone"] == row["rate"] / row["alone_rate"] < SLOW_AGAINST_ALONE, row
        # The CLI (GetJob / ListJobs carry alone_rate): get jobs -o wide's VS-ALONE, describe's Rate.
        capsys.readouterr()
        at = ["--scheduler", sched.address]
        assert gandiva_main.main(["get", "jobs", job_id, "-o", "wide", *at]) == 0
        head, line = capsys.readouterr().out.splitlines()
        assert head.split()[10] == "VS-ALONE" and re.fullmatch(r"0\.\d\dx", line.split()[10]), (head, line)
        assert line.split()[11] == "slow", line
        assert gandiva_main.main(["get", "jobs", job_id, "-o", "json", *at]) == 0
        assert json.loads(capsys.readouterr().out)[0]["alone_rate"] > 0
        assert gandiva_main.main(["describe", "job", job_id, *at]) == 0
        assert re.search(r"^Rate: +0\.10 mini-batches/s \(0\.\d\dx its rate alone, [0-9.]+: measured while the one "
                         r"job running on its GPUs\)$", capsys.readouterr().out, re.MULTILINE)
        console = Console(record=True, width=250)
        console.print(render(_get(http, "/api/state")[1]))
        assert f"slower than alone: {row['name']} " in console.export_text()
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=30) as r:
            scraped = r.read().decode()
        name = row["name"]
        series = f'gandiva_job_alone_minibatch_rate{{job="{job_id}",name="{name}"}}'
        assert series in scraped, scraped[-3000:]
        rates = _get(http, f"/api/job?id={job_id}")[1]["rates"]
        assert rates[0][1] == pytest.approx(40.0) and rates[-1][1] == pytest.approx(0.1) and rates[-1][2], rates
        dom = chromium_dom(f"http://{http}/#job={job_id}", budget_ms=4000)
        cell = re.search(rf'data-job="{job_id}".*?<td class="num bad"[^>]*>([^<]*)</td>', dom, re.DOTALL)
        assert cell is not None and re.fullmatch(r"0\.1 \(0\.\d\dx alone\)", cell.group(1)), dom[-3000:]
        # The chart, shown: its rate's line ends under its rate alone's (SVG y grows downwards).
        assert '<div id="job-rates-box">' in dom, dom[-3000:]
        drawn = {c: re.search(rf'<polyline points="([^"]*)"[^>]*class="{c}"', dom) for c in ("rate", "alone")}
        assert drawn["rate"] and drawn["alone"], dom[-3000:]
        ends = {c: float(m.group(1).split()[-1].split(",")[1]) for c, m in drawn.items() if m}
        assert ends["rate"] > ends["alone"], ends
    finally:
        f.close()
