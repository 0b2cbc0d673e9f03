"""The multihost harness's own promises: its process sampler, which every fault test's
"never two copies" check rests on, sees every process on the test's hosts."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from . import conftest
from .conftest import Net, _skip_reason


def test_a_sample_taken_while_a_host_is_added_still_sees_that_hosts_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`ip netns add` first creates the namespace's path as an empty file, then mounts the
    namespace over it. A sample taken in between (the sampler runs while helpers are
    added; 5 adds in 20 show that file here) used to keep that file's inode as the host's
    for good: no process of that host was ever seen (CI: "the warm process was not seen
    within 60s"), and none could count as a second copy."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    real_ip = conftest._ip

    def ip(*args: str) -> None:
        if args[:2] == ("netns", "add") and args[2].endswith("-h1"):
            path = Path(f"/run/netns/{args[2]}")
            path.touch()  # what `ip netns add` makes first ...
            try:
                assert net.inodes  # ... the sampler looks now ...
            finally:
                path.unlink()  # (made again by the real add below)
        real_ip(*args)  # ... and the namespace is mounted over it

    monkeypatch.setattr(conftest, "_ip", ip)
    net = Net()
    proc = None
    try:
        ns, _ = net.add_host("h1")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "30"])
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/net") == ours:  # `ip` enters it, then runs sleep
            assert time.monotonic() < deadline, "the process never entered its namespace"
            time.sleep(0.01)
        assert net.owns(proc.pid), "a process on host h1 is not seen as the test's"
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(5)
        net.close()


def test_a_cluster_closed_mid_fault_stops_a_held_helper_at_once_and_leaves_no_lease_folder(
        multihost: conftest.Cluster) -> None:
    """A fault test that fails while it holds a helper with SIGSTOP (test_i9s_faults -k
    transfer, -k failed_at_both_ends) or after it killed one with -9 leaves the cluster to
    the fixture's close. The held helper never handled the SIGTERM close sent it: close
    waited 15 s for it, then killed it with -9 (teardown 20.5 s instead of 2 s, seen), and
    a helper killed with -9 leaves its lease folder in /dev/shm (one more each such run:
    /dev/shm/gandiva-lease-*). Now the held helper is continued with its SIGTERM and stops
    as it would (its own exit, which removes its folder), and the folders of helpers killed
    with -9 go with the cluster."""
    from migration_helper.daemon import lease_path

    c = multihost
    c.add_helper("h1")
    # h2 under a jumped wall clock (test_i9s_faults -k wall_clock): libfaketime's shared
    # memory, /dev/shm/faketime_shm_PID and sem.faketime_sem_PID, was left by each such host.
    c.add_helper("h2", env=conftest.WallClock(c.tmp).env() if conftest.faketime_library() else None)
    folders = {name: lease_path(c.tmp / "rd" / name).parent for name in ("h1", "h2")}
    assert all(f.is_dir() for f in folders.values()), folders
    c.signal("h1", signal.SIGSTOP)  # the test fails here, before it lets h1 go
    c.kill9("h2")
    c.close()
    assert c.procs["h1"].wait(10) != -signal.SIGKILL, "the held helper had to be killed with -9"
    left = [str(f) for f in folders.values() if f.exists()]
    assert left == [], f"lease folders left in /dev/shm: {left}"
    h2 = c.procs["h2"].pid
    left = [n for n in (f"faketime_shm_{h2}", f"sem.faketime_sem_{h2}") if Path("/dev/shm", n).exists()]
    assert left == [], f"libfaketime's files left in /dev/shm: {left}"


def test_a_database_host_that_fails_to_start_leaves_no_server_and_no_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """PgHost (a test's own PostgreSQL on a host of its own) starts its server, then
    pins the scheduler's and the database's link addresses. A failure there (or in
    initdb, or the start) raised out of its constructor: the fixture had no PgHost to
    close, and the server went on running in a namespace about to be deleted, its
    folder left in /tmp, one of each such run. Now the constructor stops what it
    started before it raises."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if not Path(conftest.PG_BIN, "postgres").exists():
        pytest.skip(f"PostgreSQL 15 is not installed ({conftest.PG_BIN})")
    real_ip = conftest._ip

    def ip(*args: str) -> None:
        if "neigh" in args:
            raise subprocess.CalledProcessError(2, ["ip", *args], stderr="RTNETLINK answers: (injected)")
        real_ip(*args)

    monkeypatch.setattr(conftest, "_ip", ip)
    folders = f"/tmp/{conftest.PREFIX}-pg-*"
    before = set(glob.glob(folders))
    net = Net()
    try:
        net.add_host("sched")
        with pytest.raises(subprocess.CalledProcessError):
            conftest.PgHost(net)
        running = net.pids()
        assert running == [], f"PostgreSQL still runs on the db host: pids {running}"
        assert set(glob.glob(folders)) - before == set(), "its folder was left in /tmp"
    finally:
        for pid in net.pids():  # (what the constructor left, before it stopped it)
            os.kill(pid, signal.SIGKILL)
        net.close()


def test_a_bridge_that_fails_to_come_up_leaves_no_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Net() makes the bridge's namespace, then the bridge in it. A failure there (a kernel
    without the bridge module) raised out of its constructor: the fixture had no Net to
    close, and the namespace stayed in /run/netns for good. Now Net deletes it first."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    real_ip = conftest._ip

    def ip(*args: str) -> None:
        if args[-2:] == ("type", "bridge"):
            raise subprocess.CalledProcessError(2, ["ip", *args], stderr="Error: Unknown device type. (injected)")
        real_ip(*args)

    monkeypatch.setattr(conftest, "_ip", ip)
    before = set(os.listdir("/run/netns"))
    with pytest.raises(subprocess.CalledProcessError):
        Net()
    made = [ns for ns in set(os.listdir("/run/netns")) - before if ns.startswith(f"{conftest.PREFIX}-")]
    # (another test of this prefix may add one meanwhile: only a bridge's namespace counts)
    assert [ns for ns in made if ns.endswith("-br")] == [], f"namespace left: {made}"


def test_a_net_that_draws_a_token_another_net_holds_leaves_that_net_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Net names its namespaces PREFIX-TOKEN-*, TOKEN 4 hex digits drawn at random; two
    tests of one prefix at the same time (pytest-xdist, a loop beside a run) may draw the
    same. The second's `ip netns add` of the bridge's namespace then failed ("File exists"):
    the second test erred, and since 317cde0e its constructor's clean-up also deleted that
    namespace, the first test's bridge, every host of the first cut off from the others
    mid-test. Now a token held is passed over: the second draws another."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    first = Net()
    try:
        first.add_host("a")
        drawn = iter([first.tok, "0000", "ffff"])
        real = conftest.uuid.uuid4

        class Drawn:
            hex = ""

        def uuid4() -> Drawn:
            d = Drawn()
            d.hex = next(drawn, None) or real().hex
            return d

        monkeypatch.setattr(conftest.uuid, "uuid4", uuid4)
        second = Net()
        try:
            ours = [ns for ns in first.made if os.path.exists(f"/run/netns/{ns}")]
            assert ours == first.made, f"the first net's namespaces deleted: {sorted(set(first.made) - set(ours))}"
            assert second.tok != first.tok and second.bridge_ns not in first.made
            second.close()
            assert all(os.path.exists(f"/run/netns/{ns}") for ns in first.made), "the second's close took the first's"
        finally:
            second.close()
    finally:
        first.close()


def test_a_prefix_too_long_for_a_link_name_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """GANDIVA_NETNS_PREFIX=rr-simflakes (an engineer's name, as the session's rules ask): every
    multihost test failed with "Command '['ip', '-n', 'rr-simflakes-ed32-br', 'link', 'add',
    'rr-simflakesed32br', 'type', 'bridge']' returned non-zero exit status 2", the reason (a link
    name of 18 characters, Linux allows 15) not shown. Now Net() says so, naming the variable,
    before it makes anything."""
    monkeypatch.setattr(conftest, "PREFIX", "rr-simflakes")
    before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    with pytest.raises(ValueError, match=r"GANDIVA_NETNS_PREFIX='rr-simflakes' is 12 characters, at most 9"):
        Net()
    after = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert [ns for ns in after - before if ns.startswith("rr-simflakes-")] == []
