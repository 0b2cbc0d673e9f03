"""Introspective packing: try running two time-sliced jobs at once, keep it only if it pays.

Packing engages only when the cluster is overloaded (some job waits in a time-slice
group). In each group with one running job and suspended ones, the lowest-utilization
suspended job whose profiled memory fits beside the running job is packed onto the
running job's GPUs (groups whose running job has the lowest utilization go first).
After ``pack_trial_s`` the two measured rates, each divided by that job's rate
alone, must sum to more than 1 + ``pack_min_gain`` (time-slicing gives exactly 1);
otherwise the job is unpacked and the pair (by model names, else job ids) is not
tried again.
"""

from __future__ import annotations

from scheduler.policy.cluster import Ledger, Placement
from scheduler.policy.state import GandivaState, PackTrial
from scheduler.policy.types import Decision, JobView, Pack, PolicyConfig, Unpack


def alone_rate(job: JobView) -> float | None:
    """The job's rate when running alone: measured, else from its profiled step time."""
    if job.rate:
        return job.rate
    if job.profile and job.profile.step_time_s:
        return 1.0 / job.profile.step_time_s
    return None


def pair_key(a: JobView, b: JobView) -> frozenset[str]:
    if a.model and b.model:
        return frozenset((f"model:{a.model}", f"model:{b.model}"))
    return frozenset((f"job:{a.id}", f"job:{b.id}"))


def judge_trials(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Decision]:
    """Keep or undo every packing trial that has run for ``pack_trial_s``."""
    now = ledger.snapshot.now
    out: list[Decision] = []
    for job_id, trial in list(state.trials.items()):
        job, partner = ledger.jobs[job_id], ledger.jobs[trial.partner_id]
        ends = trial.started_at + config.pack_trial_s
        if now < ends or job.rate is None or partner.rate is None:
            state.wake_at(max(ends, now + config.quantum_s / 4))
            continue
        del state.trials[job_id]
        ledger.touch(ledger.placement[job_id])  # its group may rotate or pack again
        gain = job.rate / trial.base_rates[0] + partner.rate / trial.base_rates[1]
        if gain > 1.0 + config.pack_min_gain:
            state.kept_pairs[job_id] = partner.id
            state.kept_pairs[partner.id] = job_id
            continue
        state.rejected.add(pair_key(job, partner))
        ledger.set_state(job_id, "SUSPENDED")
        out.append(Unpack(job_id, ledger.placement[job_id],
                          reason=f"packed rate {gain:.2f}x of time-slicing is no gain"))
    return out


def _fits(a: JobView, b: JobView, ledger: Ledger) -> bool:
    if a.profile is None or b.profile is None:
        return False  # only after profiling (brief section 2)
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
        return profile.gpu_util if profile else 1.0

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
            key=lambda v: (util(v.id), v.id),
        )
        for guest in guests:
            if (util(guest.id) <= config.pack_max_util and _fits(guest, host, ledger)
                    and pair_key(guest, host) not in state.rejected
                    and alone_rate(guest) and alone_rate(host)):
                choices.append((util(host.id), util(guest.id), guest, host))
                break
    out: list[Decision] = []
    for _, _, guest, host in sorted(choices, key=lambda c: (c[0], c[1], c[2].id)):
        base = (alone_rate(guest) or 1.0, alone_rate(host) or 1.0)
        state.trials[guest.id] = PackTrial(guest.id, host.id, ledger.snapshot.now, base)
        state.wake_at(ledger.snapshot.now + config.pack_trial_s)
        ledger.set_state(guest.id, "RUNNING")
        out.append(Pack(guest.id, ledger.placement[host.id],
                        reason=f"trial: utilization {util(guest.id):.2f} + {util(host.id):.2f}"))
    return out
