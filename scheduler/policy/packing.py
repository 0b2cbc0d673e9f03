"""Introspective packing: try running two time-sliced jobs at once, keep it only if it pays.

Packing engages only when the cluster is overloaded (some job waits in a time-slice
group). In each group with one running job and suspended ones, the lowest-utilization
suspended job whose profiled memory fits beside the running job is packed onto the
running job's GPUs (groups whose running job has the lowest utilization go first).
After ``pack_trial_s`` the two measured rates, each divided by that job's rate
alone, must sum to more than 1 + ``pack_min_gain`` (time-slicing gives exactly 1);
otherwise the job is unpacked and the pair (by model names, else job ids) is not
tried again. A trial cut short (a job of the pair finished, or was suspended or moved
for another job) is judged by the rates sampled in its second half, or is void if it
had not run that long. A trial whose two jobs no longer share its GPUs without the policy
having moved them (their server went down, a job was re-queued or moved by an operator)
is void: what was sampled before cannot be told from a fault. Every verdict is kept in
``GandivaState.verdicts`` with its reason (the live scheduler's decision log shows them).
Two jobs found running together without a trial or a kept verdict (``trial_of_co_run``)
are judged by a trial as they run; rotation parts them where none can judge them.
"""

from __future__ import annotations

from dataclasses import replace

from scheduler.policy.cluster import Ledger, Placement, arrival_key
from scheduler.policy.state import GandivaState, PackTrial
from scheduler.policy.types import Decision, JobView, Pack, PolicyConfig, Unpack


def alone_rate(job: JobView) -> float | None:
    """The job's rate when running alone on its GPUs, a trial's baseline: measured so
    (``JobView.alone_rate``), else from its profiled step time; None: the trial waits.

    Never its last ``rate``: a job suspended when a trial was cut short, void or undone
    carried its packed rate as its rate "alone" into its next trial (a pair halving both
    jobs' rates was judged 1.25x of time-slicing and kept), and so did a job beside a
    newcomer that ran before its suspend took effect (CI: "victim 2.5 packed vs 2.5 alone")."""
    if job.alone_rate:
        return job.alone_rate
    if job.profile and job.profile.step_time_s:
        return 1.0 / job.profile.step_time_s
    return None


def pair_key(a: JobView, b: JobView) -> frozenset[str]:
    if a.model and b.model:
        return frozenset((f"model:{a.model}", f"model:{b.model}"))
    return frozenset((f"job:{a.id}", f"job:{b.id}"))


def _verdict(state: GandivaState, trial: PackTrial, rates: tuple[float, float], config: PolicyConfig,
             how: str) -> tuple[bool, float, str]:
    """Keep (True) or not, the gain, and the reason; a pair found no better is rejected.

    Each job's packed rate is divided by its rate alone, and that ratio is clipped at 1: a
    job does not run faster beside another than alone, and both rates come from inside the
    users' own processes, so a job reporting a huge rate while packed would otherwise keep
    any pair however slow its partner. With ``pack_no_loser`` a pair is also undone when
    either job keeps less than its time-slice share (1/2) of its rate alone."""
    ids = (trial.job_id, trial.partner_id)
    if trial.found:
        how += "; found running together, not packed by the policy"
    ratios = [rates[i] / trial.base_rates[i] for i in (0, 1)]
    clipped = [f"{ids[i]}'s {ratios[i]:.2f}x" for i in (0, 1) if ratios[i] > 1.0]
    ratios = [min(1.0, r) for r in ratios]
    gain = ratios[0] + ratios[1]
    kept = gain > 1.0 + config.pack_min_gain
    what = ": kept" if kept else " is no gain"
    share = 1.0 / 2  # what time-slicing the pair would have given each job
    losers = [i for i in (0, 1) if ratios[i] < share] if config.pack_no_loser else []
    if kept and losers:
        kept = False
        what = "".join(f", but {ids[i]} kept {ratios[i]:.2f}x of its rate alone" for i in losers) + \
            f", under its time-slice share {share:.2f}: undone"
    if not kept:
        state.rejected.add(trial.pair)
    # Both measured rates and the alone rates they are compared with, so that a user can
    # check the verdict: (job) packed vs alone, (partner) packed vs alone.
    rates_seen = (f"{trial.job_id} {_rate(rates[0])} packed vs {_rate(trial.base_rates[0])} alone, "
                  f"{trial.partner_id} {_rate(rates[1])} vs {_rate(trial.base_rates[1])} mini-batches/s")
    if clipped:
        how += f"; {' and '.join(clipped)} clipped at 1x (no job runs faster packed than alone)"
    return kept, gain, f"packed rate {gain:.2f}x of time-slicing{what} ({rates_seen}; {how})"


def _rate(value: float) -> str:
    """A rate for people: three significant digits, no exponent."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _end_early(state: GandivaState, trial: PackTrial, now: float, config: PolicyConfig,
               why: str) -> bool | None:
    """A trial that cannot run to its end (a job of the pair finished, was suspended or
    moved): judged by the rates sampled in its second half, else void. Returns the verdict."""
    state.trials.pop(trial.job_id, None)
    ran = now - trial.started_at
    if trial.sample is None or trial.sampled_at is None:  # set together (judge_trials)
        state.add_verdict(now, trial, None, None,
                          f"trial void: {why} after {ran:.1f}s, before the packed rates settled")
        return None
    kept, gain, reason = _verdict(state, trial, trial.sample, config,
                                  f"measured over {trial.sampled_at - trial.started_at:.1f}s, then {why}")
    state.add_verdict(now, trial, kept, gain, reason)
    return kept


def end_trials_of(ledger: Ledger, state: GandivaState, config: PolicyConfig, job_id: str, why: str) -> None:
    """The job is being suspended or moved: end its trial, judged as far as it was measured.
    A pair found worth keeping becomes a kept pair (it then takes its turns together)."""
    for trial in [t for t in state.trials.values() if job_id in (t.job_id, t.partner_id)]:
        if _end_early(state, trial, ledger.snapshot.now, config, why) and trial.partner_id in ledger.jobs:
            state.keep_pair(trial.job_id, trial.partner_id)


def _apart(ledger: Ledger, trial: PackTrial) -> str | None:
    """Why the pair no longer runs packed on the trial's GPUs, or None while it does.

    Only the policy's own moves end a trial on purpose (end_trials_of); this is what else
    takes a job off them: its server went down (the job is back in the queue), or the
    job was re-queued or moved outside the policy (an operator's migrate or drain)."""
    where = {j: ledger.placement.get(j, ()) for j in (trial.job_id, trial.partner_id)}
    if all(gpus == trial.gpus for gpus in where.values()):
        return None
    servers = ", ".join(sorted({g.server for g in trial.gpus}))
    queued = [j for j, gpus in where.items() if not gpus]
    if queued:
        return f"{' and '.join(queued)} went back to the queue from {servers} (a server went down, or a re-queue)"
    moved = [f"{j} to {', '.join(sorted({g.server for g in gpus}))}"
             for j, gpus in where.items() if gpus != trial.gpus]
    return f"moved off the trial's GPUs on {servers}: {' and '.join(moved)}"


def _void_apart(ledger: Ledger, state: GandivaState, trial: PackTrial, why: str) -> list[Decision]:
    """End a trial whose jobs no longer share its GPUs: void, neither kept nor rejected
    (rates sampled before a fault, or beside another partner, say nothing of the pair).
    Two jobs still running together on other GPUs are unpacked: they were never judged."""
    now = ledger.snapshot.now
    del state.trials[trial.job_id]
    job_id, partner_id = trial.job_id, trial.partner_id
    for j in (job_id, partner_id):
        if j in ledger.placement:
            ledger.touch(ledger.placement[j])  # its group may rotate or pack again
    gpus = ledger.placement.get(job_id, ())
    together = (gpus != () and gpus == ledger.placement.get(partner_id)
                and ledger.state[job_id] == ledger.state[partner_id] == "RUNNING")
    reason = f"trial void: {why} after {now - trial.started_at:.1f}s; the pair is not judged"
    state.add_verdict(now, trial, None, None, reason, unpacked=together)
    if not together:
        return []
    ledger.set_state(job_id, "SUSPENDED")
    return [Unpack(job_id, gpus, reason=reason)]


def judge_trials(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Decision]:
    """Keep or undo every packing trial that has run for ``pack_trial_s``.

    Rates are sampled on every call in a trial's second half (the jobs' rates have
    settled at their packed values by then), only while both jobs run on the trial's
    GPUs; a trial whose job or partner finished before its end is judged by the last
    sample (nothing is left to unpack: a pair found no better is only not tried again),
    or void without one. A trial whose jobs left its GPUs otherwise is void (_apart).
    """
    now = ledger.snapshot.now
    out: list[Decision] = []
    for job_id, trial in list(state.trials.items()):
        job, partner = ledger.jobs.get(job_id), ledger.jobs.get(trial.partner_id)
        if job is None or partner is None:
            gone = job_id if job is None else trial.partner_id
            _end_early(state, trial, now, config, f"job {gone} ended")
            continue
        why = _apart(ledger, trial)
        if why is not None:
            out += _void_apart(ledger, state, trial, why)
            continue
        ends = trial.started_at + config.pack_trial_s
        packed = ledger.state[job_id] == ledger.state[partner.id] == "RUNNING"  # on its GPUs (_apart)
        if (packed and job.rate is not None and partner.rate is not None
                and now >= trial.started_at + config.pack_trial_s / 2):
            trial = state.trials[job_id] = replace(trial, sample=(job.rate, partner.rate), sampled_at=now)
        if now < ends or job.rate is None or partner.rate is None:
            grace_end = ends + config.pack_trial_s  # a rate may come late, but not never
            if now < ends or now < grace_end:
                state.wake_at(max(ends, min(grace_end, now + config.quantum_s / 4)))
                continue
            # A job that reports no rate (0 is "not measured") would otherwise stay packed
            # for as long as it liked; its pair is not judged (nor rejected), only undone.
            del state.trials[job_id]
            ledger.touch(ledger.placement[job_id])
            silent = " and ".join(j.id for j in (job, partner) if j.rate is None)
            reason = f"trial void: no rate measured from {silent} after {now - trial.started_at:.1f}s packed"
            state.add_verdict(now, trial, None, None, reason, unpacked=True)
            ledger.set_state(job_id, "SUSPENDED")
            out.append(Unpack(job_id, ledger.placement[job_id], reason=reason))
            continue
        del state.trials[job_id]
        ledger.touch(ledger.placement[job_id])  # its group may rotate or pack again
        kept, gain, reason = _verdict(state, trial, (job.rate, partner.rate), config,
                                      f"measured over {now - trial.started_at:.1f}s")
        state.add_verdict(now, trial, kept, gain, reason, unpacked=not kept)
        if kept:
            state.keep_pair(job_id, partner.id)
            continue
        ledger.set_state(job_id, "SUSPENDED")
        out.append(Unpack(job_id, ledger.placement[job_id], reason=reason))
    return out


def trial_of_co_run(ledger: Ledger, state: GandivaState, config: PolicyConfig, gpus: Placement,
                    running: list[str]) -> bool:
    """Two jobs found running together on ``gpus`` that no trial put there and no verdict
    kept (live: two moves that landed on one GPU, a restart that forgot its kept pairs, an
    operator's resume): a trial of them starts now, as if packed now (they already run
    packed: no decision), kept or undone by its measured rates as any (``judge_trials``).
    The one that ran there last is the guest (unpacked if no gain). False where no trial
    can judge them: packing off, not two, a pair found no better before, a job not under
    the runtime (it cannot be unpacked) or with no rate alone to compare with."""
    if not config.enable_packing or len(running) != 2:
        return False
    host, guest = sorted((ledger.jobs[j] for j in running), key=lambda v: (v.last_state_change_at, v.id))
    if not guest.suspendable:
        host, guest = guest, host
    if (not guest.suspendable or pair_key(guest, host) in state.rejected
            or not alone_rate(guest) or not alone_rate(host)):
        return False
    _begin_trial(state, config, guest, host, gpus, ledger.snapshot.now, found=True)
    return True


def _begin_trial(state: GandivaState, config: PolicyConfig, guest: JobView, host: JobView, gpus: Placement,
                 now: float, found: bool = False) -> None:
    """A trial of ``guest`` packed beside ``host`` on ``gpus`` runs from ``now``."""
    base = (alone_rate(guest) or 1.0, alone_rate(host) or 1.0)
    state.trials[guest.id] = PackTrial(guest.id, host.id, now, base, pair_key(guest, host), gpus=gpus, found=found)
    state.wake_at(now + config.pack_trial_s)


def _fits(a: JobView, b: JobView, ledger: Ledger) -> bool:
    if a.profile is None or b.profile is None or not (a.profile.gpu_measured and b.profile.gpu_measured):
        return False  # only after profiling (brief section 2); host memory alone is not enough
    gpus = ledger.placement[b.id]
    capacity = min(ledger.servers[g.server].gpu_memory_bytes for g in gpus)
    return a.profile.memory_bytes + b.profile.memory_bytes <= capacity


def start_trials(ledger: Ledger, state: GandivaState, config: PolicyConfig,
                 look: set[Placement] | None = None) -> list[Decision] | None:
    """Start one packing trial in every eligible time-slice group; None: none looked at.

    ``look``: only these groups changed since the last call that looked (the others were
    not eligible then and nothing about them changed); None: look at every group.
    """
    if not config.enable_packing or not ledger.overloaded():
        return None
    def util(job_id: str) -> float:
        profile = ledger.jobs[job_id].profile
        return profile.gpu_util if profile and profile.gpu_measured else 1.0

    choices = []
    for gpus in (ledger.shared if look is None else ledger.shared.intersection(look)):
        members = ledger.members(gpus)
        running = [m for m in members if ledger.state[m] == "RUNNING"]
        if len(running) != 1 or any(m in state.trials or m in ledger.changed for m in members):
            continue
        host = ledger.jobs[running[0]]
        if not host.suspendable or host.id in state.kept_pairs or util(host.id) > config.pack_max_util:
            continue
        guests = sorted(
            (ledger.jobs[m] for m in members if ledger.state[m] == "SUSPENDED"
             and m not in state.kept_pairs and ledger.jobs[m].migratable),
            key=lambda v: (util(v.id), arrival_key(v)),
        )
        for guest in guests:
            if (util(guest.id) <= config.pack_max_util and _fits(guest, host, ledger)
                    and pair_key(guest, host) not in state.rejected
                    and alone_rate(guest) and alone_rate(host)):
                choices.append((util(host.id), util(guest.id), guest, host))
                break
    out: list[Decision] = []
    for _, _, guest, host in sorted(choices, key=lambda c: (c[0], c[1], arrival_key(c[2]))):
        _begin_trial(state, config, guest, host, ledger.placement[host.id], ledger.snapshot.now)
        ledger.set_state(guest.id, "RUNNING")
        out.append(Pack(guest.id, ledger.placement[host.id],
                        reason=f"trial: packed beside {host.id}, utilization "
                               f"{util(guest.id):.2f} + {util(host.id):.2f}"))
    return out
