"""The policy's vocabulary: an immutable cluster snapshot in, a list of decisions out.

Everything here is a frozen dataclass so that the live scheduler (which builds the
snapshot from its database) and the simulator (which builds it from its own state)
hand the policy exactly the same kind of value, and the policy cannot mutate it.

Conventions the policy relies on:
- A job's ``placement`` holds the GPUs it is bound to. RUNNING jobs execute there;
  SUSPENDED jobs keep their placement while they wait for their next time slice
  (their GPU memory is released, see brief section 2). QUEUED jobs have none.
- Two RUNNING jobs whose placements overlap are *packed*; a RUNNING and SUSPENDED job
  on the same GPUs are *time-sliced*.
- Decisions are applied in list order. Switching happens at the job's next
  mini-batch boundary; that is the live side's business, not the policy's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

JOB_STATES = ("QUEUED", "RUNNING", "SUSPENDED", "MIGRATING")
GIB = 1 << 30


class GpuRef(NamedTuple):
    """One GPU: the server's name and the device index on that server.

    A NamedTuple rather than a frozen dataclass: it is just as immutable and ordered,
    and hashing it (the policy does that millions of times per simulated day) runs in C.
    """

    server: str
    # Shadows tuple.index(); the contract names the field so, and nothing calls the method.
    index: int  # type: ignore[assignment]


@dataclass(frozen=True)
class JobProfile:
    """What profiling measured about a job (brief section 2, primitive 5).

    memory_bytes: peak GPU memory per GPU over a mini-batch cycle.
    gpu_util: mean GPU utilization while running, 0..1.
    step_time_s: seconds per mini-batch when running alone on its GPUs.
    host_memory_bytes: host memory (resident set) the job's processes hold on each server
        it runs on, which a suspended job keeps holding (its process stays, with its GPU
        state copied out); 0: not measured (the policy assumes
        ``PolicyConfig.job_host_memory_bytes``).
    """

    memory_bytes: int
    gpu_util: float
    step_time_s: float | None = None
    host_memory_bytes: int = 0

    @property
    def gpu_measured(self) -> bool:
        """Whether the GPU side was profiled (memory_bytes > 0): the live scheduler also
        builds a profile for a job whose host memory alone was measured so far, with
        memory_bytes 0, and packing must not read that as a job that needs no memory."""
        return self.memory_bytes > 0


@dataclass(frozen=True)
class ServerView:
    """A GPU server as the policy sees it. ``gpu_memory_bytes`` is per GPU.

    ``host_memory_bytes``: the server's host memory its jobs may hold (its helper reports
    the machine's total, or what the operator set); 0: unknown, not checked. Every job
    bound to the server holds host memory there, running or suspended, so the policy
    puts no job's process on a server where it would not fit (``PolicyConfig.host_memory_use``).

    ``schedulable``: False while an operator has the server cordoned (``gandiva cordon``):
    no job comes to it (no Place, Pack beside another's job, Migrate, Grow or time-slice
    group joined there); the jobs bound to it stay, and keep their turns there.
    """

    name: str
    num_gpus: int
    up: bool = True
    gpu_memory_bytes: int = 16 * GIB
    host_memory_bytes: int = 0
    schedulable: bool = True
    # The indices of the GPUs its helper registered, when they are not 0..num_gpus-1 (a
    # helper that registered again without a GPU that failed: only index 1 of two); empty:
    # 0..num_gpus-1. The policy places only on these.
    gpu_indices: tuple[int, ...] = ()

    @property
    def registered_indices(self) -> tuple[int, ...]:
        """The indices of the GPUs the policy may place on (``gpu_indices``, else 0..num_gpus-1)."""
        return self.gpu_indices or tuple(range(self.num_gpus))


@dataclass(frozen=True)
class JobView:
    """A job that is not finished.

    gpus: the GPUs the job holds (or asks for, when queued) right now; after a Grow it
        is larger than ``base_gpus``.
    base_gpus: the GPU count the user asked for (None: same as ``gpus``); a Shrink
        returns to it.
    rate: the recent measured mini-batches per second in the job's current condition
        (alone, packed, spread); None when not measured yet.
    alone_rate: its mini-batches per second measured while it alone ran on its current
        GPUs, in its current launch (a packing trial's baseline); None when it has not run
        so: a rate sampled beside another job, on other GPUs, or across a change of either
        is never one (a suspended job's ``rate`` may be any of those).
    last_state_change_at: snapshot time of the last state or placement change; time
        slices and packing trials are measured from it.
    attained_service_s: GPU-seconds the job has run so far (Tiresias' LAS input).
    reported_at: when ``steps`` and ``attained_service_s`` were measured (progress
        arrives periodically); None means at the snapshot's ``now``.
    model: a free-form model name (used to remember which pairs packed badly).
    multi_job: the id of the hyper-parameter multi-job it belongs to, if any.
    suspendable: False when the scheduler cannot stop the job at a mini-batch boundary
        (no process of it connected a runtime); such a job holds its GPUs alone.
    arrival: the job's place among jobs submitted at the same ``submitted_at`` (a
        trace's row order in the simulator): queues break such ties by it, then by id.
        Ties used to go by id as text, so a trace's t-10 ran before its t-2.
    """

    id: str
    gpus: int
    priority: int = 1
    state: str = "QUEUED"
    placement: tuple[GpuRef, ...] = ()
    submitted_at: float = 0.0
    steps: int = 0
    rate: float | None = None
    alone_rate: float | None = None
    grow_shrink: bool = False
    migratable: bool = True
    # False: none of its processes is under the runtime, so it cannot be stopped at a
    # boundary: never time-sliced, preempted, packed, grown or moved.
    suspendable: bool = True
    profile: JobProfile | None = None
    last_state_change_at: float = 0.0
    attained_service_s: float = 0.0
    reported_at: float | None = None
    base_gpus: int | None = None
    model: str = ""
    multi_job: str | None = None
    arrival: int = 0

    def __post_init__(self) -> None:
        if self.state not in JOB_STATES:
            raise ValueError(f"job {self.id}: state {self.state!r} is not one of {JOB_STATES}")
        if self.gpus < 1:
            raise ValueError(f"job {self.id}: gpus must be at least 1, got {self.gpus}")

    @property
    def requested_gpus(self) -> int:
        """The user's GPU count (what a Shrink returns to)."""
        return self.base_gpus if self.base_gpus is not None else self.gpus

    def attained_at(self, now: float) -> float:
        """Attained GPU-seconds at ``now``, extrapolated from the last report if running."""
        if self.state != "RUNNING" or self.reported_at is None:
            return self.attained_service_s
        return self.attained_service_s + len(self.placement) * max(0.0, now - self.reported_at)

    @property
    def weight(self) -> int:
        """Time-slice weight: the priority, at least 1."""
        return max(1, self.priority)


@dataclass(frozen=True)
class SnapshotDelta:
    """What differs from the snapshot numbered ``since``: a hint for incremental consumers.

    changed: the views that are new objects since then (new jobs and rebuilt views);
    removed: ids of jobs that finished or left since then. A consumer that saw snapshot
    ``since`` may apply only these; any other consumer compares everything.
    """

    since: int
    changed: tuple[JobView, ...] = ()
    removed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ClusterSnapshot:
    """The whole cluster at one instant. ``jobs`` holds only unfinished jobs.

    ``seq`` numbers the snapshots of one producer and ``delta`` says what changed since
    an earlier one; both are optional (the live scheduler leaves them out and the policy
    then compares every job; the simulator sets them so a decision costs time in
    proportion to what changed, not to the number of jobs waiting).
    """

    now: float
    servers: tuple[ServerView, ...]
    jobs: tuple[JobView, ...] = ()
    seq: int | None = None
    delta: SnapshotDelta | None = None

    def delta_since(self, seq: int | None) -> SnapshotDelta | None:
        """``delta`` if it is relative to snapshot ``seq`` (so a consumer that saw that one
        last may apply it alone); None: the consumer compares every job."""
        delta = self.delta
        return delta if delta is not None and seq is not None and delta.since == seq else None

    @cached_property
    def server_by_name(self) -> dict[str, ServerView]:
        return {s.name: s for s in self.servers}

    @cached_property
    def jobs_on_server(self) -> dict[str, tuple[JobView, ...]]:
        """Every placed job touching each server, each job once per server."""
        acc: dict[str, list[JobView]] = {}
        for job in self.jobs:
            for name in dict.fromkeys(g.server for g in job.placement):
                acc.setdefault(name, []).append(job)
        return {name: tuple(js) for name, js in acc.items()}


# --- decisions -------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Start a QUEUED job on ``gpus`` (the GPUs are free, or time-shared: see Suspend)."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str = ""


@dataclass(frozen=True)
class Queue:
    """Leave the job queued; ``reason`` says why nothing fits (shown to users)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Suspend:
    """Suspend a RUNNING job at its next mini-batch boundary; it keeps its placement."""

    job_id: str
    reason: str = ""


@dataclass(frozen=True)
class Park:
    """Checkpoint a SUSPENDED job to disk and let its process exit: it holds no GPU and no
    host memory, and goes back to the queue with its progress (a later Place restores it
    from the checkpoint). Gandiva's ``probe_slices`` parks the newcomers it let into full
    time-slice groups once their first turn is over. Live: the shim's stop-for-migration
    into the server's ramdisk, then the job is queued with that checkpoint as its restore
    point; simulated: a later Place costs ``--restart-s``."""

    job_id: str
    reason: str = ""


@dataclass(frozen=True)
class Resume:
    """Resume a SUSPENDED job on ``gpus`` (its placement)."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str = ""


@dataclass(frozen=True)
class Pack:
    """Run a SUSPENDED or QUEUED job at the same time as the job already running on ``gpus``."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str = ""


@dataclass(frozen=True)
class Unpack:
    """End a packing trial: the job goes back to being time-sliced (suspended) on ``gpus``."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str = ""


@dataclass(frozen=True)
class Migrate:
    """Move the job to ``to_gpus`` (checkpoint, restore there); it runs there afterwards."""

    job_id: str
    to_gpus: tuple[GpuRef, ...]
    reason: str = ""


@dataclass(frozen=True)
class Grow:
    """Restart a running grow-shrink job on the larger set ``gpus`` (its whole new placement)."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str = ""


@dataclass(frozen=True)
class Shrink:
    """Return a grown job to ``gpus`` (its whole new placement, ``base_gpus`` long)."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str = ""


Decision = Place | Queue | Suspend | Park | Resume | Pack | Unpack | Migrate | Grow | Shrink


@dataclass(frozen=True)
class PolicyConfig:
    """Every knob of the policies, with the paper's values as defaults.

    quantum_s: time slice at weight 1 (brief: the paper fixes 60 s).
    reserve_after_s: a queued job that has waited this long and still does not fit
        reserves the free GPUs: jobs queued behind it may only time-share. Off (None)
        by default: on the Philly traces it made both average JCT and makespan worse.
    reserve_large_only: ``reserve_after_s`` reserves for jobs larger than a server only
        (those the ``large_block_after_s`` block does not serve: freed groups give them
        whole servers only when several go idle at once). Off by default.
    slice_slack_s: a slice ending within this many seconds after a beat (a multiple
        of quantum_s) is switched at that beat; slices end on beats so that groups
        rotate together (one round of switch commands instead of many).
    max_jobs_per_gpu: how many jobs a GPU may be time-shared by before jobs queue (16; the
        paper's setup used 4: new jobs then queued behind full groups for days on the ITP
        traces, and a suspended job holds no GPU memory). A server's host memory bounds its
        groups too (``host_memory_use``): whichever is reached first holds newcomers back.
    host_memory_use: the fraction of a server's host memory (``ServerView.host_memory_bytes``)
        its jobs may hold together, running and suspended: a job is placed on, or moved to,
        a server only if its host memory fits under that beside the jobs already there
        (the rest is left to the system and the page cache). A suspended job keeps its
        process, so this, not ``max_jobs_per_gpu`` alone, bounds time-slicing on a server.
    job_host_memory_bytes: the host memory assumed for a job not measured yet (its
        ``JobProfile.host_memory_bytes`` is 0): 4 GiB, a TensorFlow process with its CUDA
        context and input pipeline.
    pack_trial_s: how long a packing trial runs before its measured rates decide.
    pack_min_gain: packed jobs' combined normalized rate must exceed 1 + this to be kept.
    pack_max_util: jobs above this GPU utilization are not packing candidates.
    pack_no_loser: a packing trial is also undone (and the pair not tried again) when
        either job's packed rate is under half its rate alone, its time-slice share: no job
        is left worse off than time-slicing would leave it, whatever its partner reports.
    defrag_free_gpus: a non-idle server with at least this many free GPUs gets defragmented
        (paper: stop when every non-idle server has fewer than 3 of 4 GPUs free).
    defrag_interval_s: background defragmentation runs at most this often.
    max_migrations_per_round: cap on migrations issued by one decide() call.
    grow_idle_s: GPUs must have been idle this long before a grow-shrink job grows.
    tiresias_thresholds_gpu_s: attained-service queue limits of Tiresias' discretized LAS.
    tiresias_starve_factor: N > 0: a pending job outside the first queue that has waited N
        times as long as it ran (since it last entered the first queue) goes back to the
        first queue; 0 (the original's dlas-gpu): never.
    las_slices: in a time-slice group the unit with the least attained service runs next
        (the running one keeps the GPUs while it has the least); off: the one waiting
        longest, as in the paper (scheduler/policy/timeslice.py).
    slice_growth: g > 0 makes a unit's slice g x its attained service per GPU (between
        one and 32 quanta); 0: every slice is one quantum, as in the paper.
    fifo_after_s: S > 0 (with las_slices): a unit with at least S seconds of attained
        service per GPU is in the long bucket, behind every shorter one; inside it the
        unit submitted first runs, and the running one keeps the GPUs while it stays in
        its bucket (Tiresias-style service buckets); 0: least attained service throughout.
    starve_factor: K > 0 (with las_slices): a suspended unit that has waited K x its
        attained service per GPU (at least a quantum) runs next, for one slice (a
        starvation limit as Tiresias' dlas-gpu-K); 0: no limit.
    gittins_slices: with las_slices, the unit with the highest Gittins index of its
        attained service per GPU runs next, the index computed from the service with which
        the latest 1,000 jobs left the cluster (scheduler/policy/gittins.py): least attained
        service where lengths are heavy-tailed, first come first served where they are not;
        least attained service until 100 jobs have left. A refinement of las_slices's order:
        without las_slices (round-robin) it has nothing to order and does nothing.
    gittins_censored: with gittins_slices, the index's distribution is the Kaplan-Meier
        estimate of the departures and of the jobs still present, censored at the service
        they have (scheduler/policy/gittins.py): early in a trace the long jobs still
        running count too, instead of only the short ones that already left. Off by default.
    gittins_tail_fifo: with gittins_slices, the units past the table's end (service per GPU
        beyond which fewer than 20 of the latest departures ran) run first come first served
        behind every unit with an index, as Tiresias' last queue, instead of by least
        attained service: the oldest of the longest jobs finishes instead of sharing its
        GPUs with every later long job (the makespan). Off by default.
    gittins_history: with gittins_slices, the index's distribution is the window of the latest 1,000
        departures together with an even sample of up to 1,000 of the departures before it
        (every 2^k-th departure since the start; scheduler/policy/gittins.py): a burst of
        short jobs filling the window moves the index less. Off by default.
    eldest_runs: with las_slices, in each requested GPU count the job submitted first of
        those holding GPUs (running or suspended) runs ahead of every other unit of its
        time-slice group and keeps the GPUs until it ends: a newcomer placed on its group
        still runs its first slice, then it resumes. No job starves (each becomes the
        eldest of its count in turn) and the oldest of the longest jobs finishes as under
        first come first served, which the makespan needs. Off by default.
    eldest_parks: with eldest_runs, the other members of the eldest's group are parked
        (checkpointed, back in the queue, placed again elsewhere). False: they stay in its
        group, suspended, until it ends or ``lower_height`` moves them to free GPUs; parked,
        they crowd the other groups of their size, where the next-oldest long job then waits
        longer (Philly b436b2's makespan). On by default (it changes nothing while
        eldest_runs is off).
    eldest_second_group: with eldest_runs, the eldest keeps its GPUs to itself only while
        its GPU count holds another time-slice group, where the count's newcomers take their
        turns; while its group is the only one of its size (a job as large as a small
        cluster), it takes turns as any member. Without it, eldest_runs makes such a count
        first come first served: on 2x4, Philly 23dbec's 8-GPU jobs (the whole cluster)
        each waited for the one before to end (docs/simulator.md, "`eldest_runs` and
        `gittins_tail_fifo` on today's defaults"). Off by default.
    eldest_first_turns: with eldest_runs and probe_slices, a newcomer that has never run and
        finds no place and no full group of its size takes its first turn in the eldest's
        group (the paper's early feedback: without it such a newcomer waits for the eldest to
        end); the slice order then gives the GPUs back to the eldest and the newcomer is
        parked, back in the queue. Off by default.
    fifo_after_measured: with las_slices, the ``fifo_after_s`` buckets with the boundary set
        from the same departures as ``gittins_slices``'s: the service per GPU at which the
        mean residual service of the jobs that ran that long is highest (none while it
        still rises where the departures end, or before 100 jobs have left).
    balance_sizes: at the first call at least ``defrag_interval_s`` after its last look
        (it does not wake the policy itself), when the GPU count whose jobs are most
        crowded (jobs per same-size GPU set) has jobs waiting, a server of a less crowded
        GPU count is handed to it: its jobs move into same-size time-slice groups
        elsewhere, if that leaves their GPU count less crowded than the one it helps (a
        group of jobs larger than a server gives every server it spans; such jobs never
        take one).
    balance_park: with balance_sizes, when no less crowded GPU count's server can be handed
        over by moving its jobs (every same-size group elsewhere is full, or the server holds
        more jobs than ``max_migrations_per_round``), the server with the fewest jobs that
        may all be parked (free to move and under the runtime) is handed over by parking
        them instead: checkpointed to disk, back in the queue with their progress, to rejoin
        their GPU count's groups as room comes (a count's last group too, if the crowding
        test allows). Without it, once every count's groups are full a count with no group
        at all gets a server only when a whole group ends. On by default, in the simulator and
        live (measured at three loads on 19 traces, docs/simulator.md, "balance_park"; live, a
        parked job relaunched on another server has its checkpoint streamed there first).
        No effect without balance_sizes.
    balance_per_gpu: with balance_sizes, a GPU count's crowding is its jobs per GPU of its
        groups instead of per same-size GPU set: a k-GPU job counts k times less, so servers
        go to the GPU counts whose jobs get the fewest GPU-seconds each (as Tiresias' 2D
        attained service weighs a job by its GPUs) instead of the fewest turns each. Off by
        default: on the 19 traces of issue 11 it meets 16 / 16 / 15 goals against the
        defaults' 16 / 16 / 16; it wins every goal on ITP cluster02 (average JCT 75.9 -> 24.6 h)
        and loses cluster07's (212 -> 377 h), where 8-GPU jobs are most of the work
        (docs/simulator.md, "Three refinements measured and left off").
    share_block_after_s: once a queued job has waited this long, jobs queued behind it
        may not join time-slice groups (they take free GPUs only), so that groups drain
        and free GPUs reach it instead of every newcomer joining a group ahead of it;
        None: off.
    large_block_after_s: once the first queued job that fits one server has waited this
        long, jobs larger than a server queued after it may not join time-slice groups (they
        take free GPUs only), so that their groups drain and free whole servers for it;
        smaller jobs still join groups at once (early feedback kept). 3600: Tiresias' first
        queue limit (3,250 GPU-seconds) rounded to an hour, as the other rules' S; on the
        19 traces of issue 11 it met 13 / 13 / 16 goals against 12 / 12 / 16 without it and
        lost none (docs/simulator.md). None: off.
    groupless_block: with ``large_block_after_s``'s block, it holds at once (not after
        ``large_block_after_s``) while the first queued job that fits one server has no
        time-slice group of its GPU count anywhere: such a job cannot join a group or get a
        first turn, and waits for free GPUs, which the groups of jobs larger than a server
        give only once they drain (on 2x4, a group of 8-GPU jobs holds both servers while
        newcomers of 8 GPUs keep joining it: docs/heldout.md). Off by default.
    large_block_one_group: while ``large_block_after_s``'s block holds, a job larger than a
        server queued after the waiting job may still join a time-slice group of its GPU
        count (and take a first turn in one), but never the group of that count closest to
        draining (fewest members): that one alone is left to drain for the waiting job.
        Off by default (docs/simulator.md, "The block and the groups it waits on").
    large_block_lapse: ``large_block_after_s``'s block holds only while some time-slice
        group of jobs larger than a server is down to one job (its servers free when that
        job ends); while each still has jobs waiting their turns, holding newcomers back
        frees no server until all of them end, and the block lapses. Off by default
        (docs/simulator.md, same section).
    probe_slices: a queued job that has never run and finds no place (every time-slice
        group of its GPU count holds ``max_jobs_per_gpu`` jobs a GPU) joins one such group
        anyway for its first turn (one newcomer at a time per group; its servers' host
        memory permitting), so that it gets early feedback however full the cluster is; once
        its turn is over and its group still holds more than the cap, it is parked
        (``Park``: checkpointed to disk, back in the queue with its progress) instead of
        staying suspended in host memory. On by default (measured at three loads on 19
        traces, docs/simulator.md, "Probe slices by default").
    probe_park_last: with ``probe_slices`` and ``las_slices``, when a newcomer's first turn
        is over in a group still over the cap, the member the group's slice order ranks
        last (the most attained service, or the lowest Gittins index) is parked instead of
        the newcomer, if the newcomer ranks ahead of it: the cap's places in host memory go
        to the jobs the group would run first, and the rest wait on disk (as Tiresias keeps
        preempted jobs in its queue). Only a suspended single member that is free to move
        (migratable, under the runtime, in no packing trial or kept pair) is parked. Off by
        default.
    lower_kept_pairs: ``lower_height`` moves a suspended member of a kept pair onto free GPUs
        too, and the pair ends (without it, a kept pair waits for its turn in its group while
        GPUs stand idle elsewhere). Off by default: measured on 19 traces it brings JCT down
        on five and idle GPUs back to work, but costs Philly b436b2 its makespan goal
        (docs/simulator.md, "Lowering kept pairs").
    unpack_idle: when GPUs stay free after every other step of a call, no job is queued and
        no job of the pair's GPU count is suspended, a member of a kept pair running packed
        moves onto free GPUs of a server of its own GPU count (the affinity filter) and the
        pair ends: each then runs at its rate alone. Packing starts only while the cluster is
        overloaded; without this a pair kept for its summed throughput stays packed, each
        job slower, beside idle GPUs to the end (scheduler/policy/migration.py,
        ``unpack_idle``). On by default (docs/simulator.md, "`unpack_idle` by default").
    lower_spread: ``lower_height`` moves a suspended job larger than a server onto any free
        GPUs that add up to it, spread over the servers with the most free (as Algorithm 1's
        ``relaxed`` filter places such a job when it is queued), not only onto whole idle
        servers; ``consolidate`` brings it together again once idle servers can hold it.
        Without it such a job waits for its turn in its group while the free GPUs, scattered
        over partly used servers, stand idle (docs/simulator.md, "Idle GPUs while jobs
        wait").
    lower_spread_eldest: with ``lower_spread``, only the eldest job of its GPU count (the one
        submitted first of those bound to GPUs, ``Ledger.eldest_of``) is moved onto scattered
        free GPUs; the others of its count wait for whole idle servers, as without
        ``lower_spread``. At most one job of a count runs spread this way at a time: the one
        a makespan waits for, not every suspended large job (``lower_spread`` alone gives the
        free GPUs to all of them, and newly arriving jobs that fit one server find none).
        Measured on the 19 traces: nearer the makespan goal on cluster05 and e13805 but
        cluster02's JCT goal lost, so off (docs/simulator.md, "`lower_spread_eldest`").
    lower_spread_idle: with ``lower_spread``, a suspended job larger than a server is moved
        onto scattered free GPUs only while no job is queued: free GPUs that nobody waits for
        (as ``unpack_idle``). While a job is queued the free GPUs may be what it waits to add
        up to, or the room its newcomers of a smaller count need, and the large job waits for
        its turn in its group or for whole idle servers, as without ``lower_spread``.
        Measured: on the 19 traces it wins cluster05's makespan and loses nothing, but
        held-out it loses cluster05's JCT goal on 50x2 and at load 0.7 (the 1-GPU jobs wait
        longer), so off (docs/simulator.md, "`lower_spread_idle`").
    lower_spread_unwaited: with ``lower_spread_idle``, the spread waits also while a job waits
        suspended: in a group on a server whose free GPUs the spread would take, or of a GPU
        count that fits one server and could be moved by ``lower_height`` onto the free GPUs
        of one of those servers ("no job queued" is not "nobody waits": a newcomer that fits
        one server joins a time-slice group rather than the queue). Measured, off
        (docs/simulator.md, "`lower_spread_unwaited`").
    lower_spread_yield_s: with ``lower_spread_idle``, a job larger than a server running
        alone on GPUs spread over more servers than it needs gives them back once the first
        queued job that fits one server has waited this long and one of the spread job's
        servers would then hold it: it moves into a time-slice group of its GPU count (one
        with room, on whole servers of that count) and the freed GPUs go to the queued job
        (scheduler/policy/migration.py, ``spread_yield``). The spread rules look only at who
        waits when a spread is made; this bounds how long the spread keeps the GPUs once a
        smaller job queues after it. None: off (docs/simulator.md, "`lower_spread_yield_s`").
    gather_large: at the first call at least ``defrag_interval_s`` after its last look, when
        a GPU count larger than a server has jobs waiting, the most crowded of those (jobs
        per GPU of its groups) has whole servers held for it: idle servers and servers of
        less crowded GPU counts, the fewest jobs first, as many as it needs, if their jobs
        find room in same-size time-slice groups elsewhere and their GPU counts stay less
        crowded than it. No filter sees the held servers' free GPUs; their jobs move off
        (``max_migrations_per_round`` a call) and then its first waiting job starts there.
        Given up when no move can advance it, or after an hour. With ``probe_slices`` the
        servers are only lent, for the first turn of the first never-run such job, then
        given back. Off by default; the live scheduler refuses it (it launches no job over
        several servers yet).
    probe_large: with ``probe_slices``, the first never-run queued job larger than a server
        (which has a first turn only where a full time-slice group of its GPU count exists,
        rarely) takes its first turn over whole servers of other GPU counts, the fewest jobs
        first: every job running there is suspended in place, the servers are held (no job
        joins them, no group there rotates) until the turn is over, and then the job is
        parked and the groups go on (scheduler/policy/large_turns.py). One such turn at a
        time. Off by default; the live scheduler refuses it (it launches no job over
        several servers yet).
    queue_reasons: return a Queue decision, with its reason, for every job left queued
        (the live scheduler shows them to users). The simulator turns it off: it ignores
        them, and with it off a call skips the queued jobs that cannot be placed instead
        of visiting each one, so it costs time in proportion to what it decides.
    """

    quantum_s: float = 60.0
    reserve_after_s: float | None = None
    reserve_large_only: bool = False
    slice_slack_s: float = 5.0
    max_jobs_per_gpu: int = 16
    host_memory_use: float = 0.9
    job_host_memory_bytes: int = 4 * GIB
    enable_packing: bool = True
    enable_migration: bool = True
    enable_grow_shrink: bool = True
    pack_trial_s: float = 120.0
    pack_min_gain: float = 0.05
    pack_max_util: float = 0.9
    pack_no_loser: bool = False
    defrag_free_gpus: int = 3
    defrag_interval_s: float = 300.0
    max_migrations_per_round: int = 8
    grow_idle_s: float = 300.0
    # The original simulator's dlas-gpu: three queues split at 3,250 and 7,200 GPU-seconds,
    # no starvation rule (its dlas-gpu-N variants set N).
    tiresias_thresholds_gpu_s: tuple[float, ...] = (3250.0, 7200.0)
    tiresias_starve_factor: float = 0.0
    queue_reasons: bool = True
    las_slices: bool = True
    slice_growth: float = 0.1
    fifo_after_s: float = 0.0
    starve_factor: float = 0.0
    share_block_after_s: float | None = None
    large_block_after_s: float | None = 3600.0
    groupless_block: bool = False
    large_block_one_group: bool = False
    large_block_lapse: bool = False
    balance_sizes: bool = True
    balance_per_gpu: bool = False
    balance_park: bool = True
    gittins_slices: bool = True
    gittins_censored: bool = False
    gittins_tail_fifo: bool = False
    gittins_history: bool = False
    fifo_after_measured: bool = False
    eldest_runs: bool = False
    eldest_parks: bool = True
    eldest_second_group: bool = False
    eldest_first_turns: bool = False
    probe_slices: bool = True
    probe_park_last: bool = False
    lower_kept_pairs: bool = False
    lower_spread: bool = False
    lower_spread_eldest: bool = False
    lower_spread_idle: bool = False
    lower_spread_unwaited: bool = False
    lower_spread_yield_s: float | None = None
    unpack_idle: bool = True
    gather_large: bool = False
    probe_large: bool = False

    def __post_init__(self) -> None:
        if self.quantum_s <= 0:
            raise ValueError(f"quantum_s must be positive, got {self.quantum_s}")
        if self.max_jobs_per_gpu < 1:
            raise ValueError(f"max_jobs_per_gpu must be at least 1, got {self.max_jobs_per_gpu}")
        if not 0 < self.host_memory_use <= 1:
            raise ValueError(f"host_memory_use must be in (0, 1], got {self.host_memory_use}")
        if self.job_host_memory_bytes < 0:
            raise ValueError(f"job_host_memory_bytes must not be negative, got {self.job_host_memory_bytes}")
        if self.slice_growth < 0:
            raise ValueError(f"slice_growth must not be negative, got {self.slice_growth}")
        if self.fifo_after_s < 0:
            raise ValueError(f"fifo_after_s must not be negative, got {self.fifo_after_s}")
        if self.starve_factor < 0:
            raise ValueError(f"starve_factor must not be negative, got {self.starve_factor}")
        if self.fifo_after_measured and not self.las_slices:
            raise ValueError("fifo_after_measured orders the units las_slices orders: turn las_slices on too")
        if self.eldest_runs and not self.las_slices:
            raise ValueError("eldest_runs changes the order las_slices sets: turn las_slices on too")
        if self.eldest_first_turns and not (self.eldest_runs and self.probe_slices):
            raise ValueError("eldest_first_turns gives first turns (probe_slices) on the GPUs eldest_runs "
                             "keeps: turn eldest_runs and probe_slices on too")
        if self.lower_spread_idle and not self.lower_spread:
            raise ValueError("lower_spread_idle bounds when lower_spread moves a job: turn lower_spread on too")
        if self.lower_spread_unwaited and not self.lower_spread_idle:
            raise ValueError("lower_spread_unwaited bounds when lower_spread_idle moves a job: "
                             "turn lower_spread and lower_spread_idle on too")
        if self.lower_spread_yield_s is not None and not self.lower_spread_idle:
            raise ValueError("lower_spread_yield_s gives back what lower_spread_idle spreads (without it the "
                             "freed GPUs are spread again at once): turn lower_spread and lower_spread_idle on too")
        if self.eldest_second_group and not self.eldest_runs:
            raise ValueError("eldest_second_group bounds what eldest_runs does: turn eldest_runs on too")
        if not self.eldest_parks and not self.eldest_runs:
            raise ValueError("eldest_parks false changes what eldest_runs does: turn eldest_runs on too")
        if self.fifo_after_measured and self.fifo_after_s > 0:
            raise ValueError(f"fifo_after_measured sets the bucket boundary that fifo_after_s "
                             f"({self.fifo_after_s}) fixes: set one of them")
        for name in ("gittins_censored", "gittins_tail_fifo", "gittins_history"):
            if getattr(self, name) and not self.gittins_slices:
                raise ValueError(f"{name} changes gittins_slices's order: turn gittins_slices on too")
        if self.probe_large and not self.probe_slices:
            raise ValueError("probe_large gives first turns as probe_slices does, over other counts' servers: "
                             "turn probe_slices on too")
        if self.probe_large and self.gather_large:
            raise ValueError("probe_large and gather_large both hold servers for first turns of jobs larger "
                             "than a server: turn one of them off")
        if self.reserve_large_only and self.reserve_after_s is None:
            raise ValueError("reserve_large_only limits reserve_after_s's reservation: set reserve_after_s too")
        for name in ("large_block_one_group", "large_block_lapse"):
            if getattr(self, name) and self.large_block_after_s is None and not self.groupless_block:
                raise ValueError(f"{name} bounds large_block_after_s's block: set large_block_after_s too")
        if self.balance_per_gpu and not self.balance_sizes:
            raise ValueError("balance_per_gpu changes how balance_sizes measures crowding: turn balance_sizes on too")
        for name in ("share_block_after_s", "large_block_after_s", "lower_spread_yield_s"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):  # NaN compares false with any time
                raise ValueError(f"{name} must be a finite number of seconds (None turns it off), got {value}")
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        if self.defrag_free_gpus < 1:
            raise ValueError(f"defrag_free_gpus must be at least 1, got {self.defrag_free_gpus}")
        limits = self.tiresias_thresholds_gpu_s
        if any(t <= 0 for t in limits) or any(b <= a for a, b in itertools.pairwise(limits)):
            raise ValueError(f"tiresias_thresholds_gpu_s must be positive and strictly rising, got {limits}")
        if self.tiresias_starve_factor < 0:
            raise ValueError(f"tiresias_starve_factor must not be negative, got {self.tiresias_starve_factor}")
