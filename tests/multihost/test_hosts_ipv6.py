"""Hosts on IPv6 addresses only (a ULA prefix inside the test's namespaces, no IPv4
address anywhere but loopback), given by address (``[addr]:port`` in every flag) or by a
name each host resolves through its own hosts file: the scheduler and its helpers find each
other, the helpers' agents say where they are, a job migrates between them by the agents'
stream (no shared root) and ends bit-identical to an uninterrupted run, and the CLI reaches
the scheduler the same way. (Probed in s50: no fix was needed.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2

from .conftest import (
    SCHED_PORT,
    assert_bit_identical,
    feed_command,
    hostport,
    uninterrupted_variables,
)
from .test_i9s_faults import DONE, RUNNING, Cluster

pytestmark = [pytest.mark.tf, pytest.mark.slow]

STEPS = 400  # test_i9s_faults.py's count: one uninterrupted run serves both


@pytest.mark.full  # no default test: nothing of the product is particular to these hosts
@pytest.mark.parametrize("multihost", [{"ipv6": True}, {"ipv6": True, "names": True}], indirect=True,
                         ids=["by_address", "by_name"])
def test_hosts_on_ipv6_only_migrate_a_job_bit_identical(multihost: Cluster, tmp_path: Path) -> None:
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    c.add_helper("h1", shared=False)
    c.add_helper("h2", shared=False)
    agents = {s.name: s.address for s in c.stub.ListServers(scheduler_pb2.ListServersRequest()).servers}
    for name in ("h1", "h2"):
        assert agents[name].startswith(hostport(c.net.reach(name), "")), agents
    dump = c.tmp / "final.npz"
    job_id = c.submit("feed", feed_command(STEPS, dump, sleep=0.1))  # 40 s: the move (a pre-warm) fits on a loaded machine
    c.wait(lambda: (j := c.job(job_id)).steps > 20 and j.state == RUNNING, 90)
    src = c.where(job_id)
    dest = "h2" if src == "h1" else "h1"
    c.migrate(job_id, dest)
    c.wait(lambda: c.where(job_id) == dest, 90)
    done = c.wait(lambda: (j := c.job(job_id)).state in DONE and j, 120)
    assert isinstance(done, common_pb2.Job)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, done.message
    assert done.steps == STEPS
    assert any(t.reason.startswith(f"migrated to {dest}") for t in done.history), [t.reason for t in done.history]
    assert_bit_identical(dump, STEPS, tmp_path)
    cli = subprocess.run(["ip", "netns", "exec", c.net.hosts["h1"][0], sys.executable, "-m", "gandiva_cli.main",
                          "--scheduler", hostport(c.net.reach("sched"), SCHED_PORT), "get", "jobs"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and job_id in cli.stdout, cli.stdout + cli.stderr
    assert c.sampler.violations == [], c.sampler.violations
