"""The Elastic Scheduler: turns availability and training events into minimal topology changes.

Every event goes through the same stages: (1) the set of rollout workers that may serve
(the availability budget; the overlap zone while borrowed), (2) the decision: mode and
role counts for that many workers, (3) a minimal-change plan from the current roles,
(4) an executor carries it out. Shrinks run at once, together with any role switches
the survivors need; expansions run in the background and are cancelled as a whole if a
later shrink takes GPUs they were preparing, their roles settled at admission; the
overlap zone is borrowed after Training Finished (if the policy and gate allow) and
returned before Training Begin. After every rollout batch the runtime tracker refits
the decision model and the roles are re-decided (hysteresis keeps small gains out).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pearl.control.decision import DecisionConfig, borrow_gate, decide, decide_split
from pearl.control.interfaces import Clock, WorkerRole
from pearl.control.planner import plan_transition
from pearl.control.policies import Borrowing, PDMode, Policy, Pool
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.rollout import BatchResult
from pearl.control.state import SlotId, Topology, WorkerStatus
from pearl.control.toggle import IntraScaleToggleManager
from pearl.control.tracker import RuntimeTracker

RESTART_ATTEMPTS = 3  # starts of a failed slot's replacement before giving the slot up
RESTART_BACKOFF_S = 5.0  # between them (a lost machine takes Ray seconds to declare)


@dataclass(slots=True)
class ElasticEvent:
    at: float
    preemptible_gpus: int
    workers_before: int
    workers_target: int
    left: tuple[SlotId, ...]
    joining: tuple[SlotId, ...]


@dataclass(slots=True)
class RoleDecider:
    """Stage 2-3: the roles a set of workers should take under a policy."""

    policy: Policy
    tracker: RuntimeTracker | None = None
    config: DecisionConfig = field(default_factory=DecisionConfig)
    log: Callable[[dict], None] = lambda event: None

    def roles(
        self, workers: list[SlotId], current: Mapping[SlotId, WorkerRole]
    ) -> dict[SlotId, WorkerRole]:
        """Roles for ``workers`` (the next active set), changing as few as possible of
        ``current`` (the active set's roles now)."""
        n = len(workers)
        if n == 0:
            return {}
        counts = self.counts(n, current)
        survivors = {s: r for s, r in current.items() if s in set(workers)}
        plan = plan_transition(survivors, workers, counts.role_counts())
        return plan.apply(survivors)

    def counts(self, n: int, current: Mapping[SlotId, WorkerRole]) -> Topology:
        pd = self.policy.pd
        if n < 2 or pd is PDMode.COLOCATED:
            return Topology.colocation(n)
        if pd is PDMode.STATIC:
            return Topology.split(*self.policy.static_counts(n))
        now = Topology.from_counts(Counter(current.values()))
        if pd is PDMode.DISAGGREGATED:
            if self.tracker is None:
                return Topology.split(*self.policy.static_counts(n))
            # Before the first refit the tracker's prior (the cost model) picks the split.
            decision = decide_split(self.tracker.params, n, now, self.config)
            self.log({"kind": "decision", "workers": n, "current": now.label, **decision.to_dict()})
            return decision.target
        if self.tracker is None or self.tracker.steps == 0:
            return Topology.colocation(n)  # nothing measured yet: the safe mode
        decision = decide(self.tracker.params, n, now if now.is_valid else None, self.config)
        self.log({"kind": "decision", "workers": n, "current": now.label, **decision.to_dict()})
        return decision.target

    def best_makespan(self, n: int) -> float | None:
        """The model's best predicted makespan with ``n`` workers (None before any refit)."""
        if self.tracker is None or self.tracker.steps == 0 or n < 1:
            return None
        return decide(self.tracker.params, n, None, self.config).best.makespan_s


class ElasticScheduler:
    """Reserved slots always serve; preemptible slots follow the availability budget; the
    overlap zone is borrowed between updates; roles follow the policy's PD mode."""

    def __init__(
        self,
        rebuilder: InterScaleRebuilder,
        reserved: list[SlotId],
        preemptible: list[SlotId],
        gpus_per_worker: int,
        clock: Clock,
        decider: RoleDecider | None = None,
        toggle: IntraScaleToggleManager | None = None,
        tracker: RuntimeTracker | None = None,
        progress: Callable[[], tuple[int, int]] | None = None,
        log: Callable[[dict], None] | None = None,
    ) -> None:
        self.rebuilder = rebuilder
        self.table = rebuilder.table
        self.reserved = list(reserved)
        self.preemptible = list(preemptible)
        self.gpus_per_worker = gpus_per_worker
        self.clock = clock
        self.decider = decider or RoleDecider(
            Policy("colocated", Pool.ELASTIC, PDMode.COLOCATED, Borrowing.OFF)
        )
        self.toggle = toggle
        self.tracker = tracker
        # (R, B): unfinished and total trajectories of the rollout batch borrowing would serve.
        self.progress = progress or (lambda: (1, 1))
        self._log = log or (lambda event: None)
        self.events: list[ElasticEvent] = []
        self.budget_gpus = 0
        self.failures = 0  # worker processes that died and were replaced
        # Background expansions in flight, each a group admitted (or cancelled) as a whole.
        self._expansions: dict[asyncio.Task[bool], frozenset[SlotId]] = {}
        self._lock = asyncio.Lock()  # one reconfiguration at a time (the table serializes too)
        self._probed = False  # the gate borrowed once against the model, to measure
        self._probing = False  # the round the gate just opened is that probe
        self._replacements: set[asyncio.Future] = set()  # overlap workers being restarted

    # -- helpers -------------------------------------------------------------------
    def log(self, event: dict) -> None:
        self._log({"t": round(self.clock.now(), 6), **event})

    def active_roles(self) -> dict[SlotId, WorkerRole]:
        snap = self.table.snapshot()
        return {s: snap.slot(s).role for s in self.rebuilder.workers}

    def _roles_for(self, workers) -> dict[SlotId, WorkerRole]:
        return self.decider.roles(sorted(workers), self.active_roles())

    async def _reassign(self, roles: Mapping[SlotId, WorkerRole], why: str) -> None:
        current = self.active_roles()
        changes = {s: r for s, r in roles.items() if s in current and current[s] is not r}
        if changes:
            self.log({"kind": "reassign", "why": why, "roles": _labels(changes)})
            await self.rebuilder.reassign(changes)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self, preemptible_gpus: int = 0) -> None:
        """Bring up the reserved workers (blocking: nothing can run without them)."""
        roles = self.decider.roles(sorted(self.reserved), {})
        self.log({"kind": "start", "roles": _labels(roles)})
        await self.rebuilder.expand(roles)
        if preemptible_gpus:
            await self.on_availability(preemptible_gpus)

    async def on_availability(self, preemptible_gpus: int) -> None:
        """Stages 1-4 for a change in the number of preemptible GPUs."""
        async with self._lock:
            await self._on_availability(preemptible_gpus)

    async def _on_availability(self, preemptible_gpus: int) -> None:
        budget = min(len(self.preemptible), max(0, preemptible_gpus) // self.gpus_per_worker)
        self.budget_gpus = budget * self.gpus_per_worker
        target = set(self.reserved) | set(self.preemptible[:budget])
        dedicated = set(self.reserved) | set(self.preemptible)
        self._expansions = {t: g for t, g in self._expansions.items() if not t.done()}
        for task, group in list(self._expansions.items()):
            if group - target:  # GPUs being prepared were reclaimed: cancel the whole group
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                del self._expansions[task]
                self.log({"kind": "expansion_cancelled", "workers": sorted(group)})
        active = set(self.rebuilder.workers)
        leaving = sorted((active & dedicated) - target)
        in_flight = set().union(*self._expansions.values())
        joining = sorted(target - active - in_flight)
        self.events.append(
            ElasticEvent(
                self.clock.now(),
                preemptible_gpus,
                len(active & dedicated),
                len(target),
                tuple(leaving),
                tuple(joining),
            )
        )
        self.log(
            {
                "kind": "availability",
                "preemptible_gpus": preemptible_gpus,
                "budget_gpus": self.budget_gpus,
                "leaving": leaving,
                "joining": joining,
            }
        )
        if leaving:
            survivors = active - set(leaving)
            roles = self._roles_for(survivors)
            self.log({"kind": "shrink", "leaving": leaving, "roles": _labels(roles)})
            await self.rebuilder.shrink(leaving, roles)
        if joining:
            guess = self._roles_for(set(self.rebuilder.workers) | set(joining))
            roles = {s: guess[s] for s in joining}
            self.log({"kind": "expand", "joining": joining, "roles": _labels(roles)})
            task = asyncio.ensure_future(self._expand(roles))
            self._expansions[task] = frozenset(joining)

    async def _expand(self, roles: Mapping[SlotId, WorkerRole]) -> bool:
        def at_admission(workers: list[SlotId]) -> dict[SlotId, WorkerRole]:
            final = self._roles_for(workers)
            self.log({"kind": "admit", "joining": sorted(roles), "roles": _labels(final)})
            return final

        ok = await self.rebuilder.expand(roles, at_admission, admission_lock=self._lock)
        if not ok:
            self.log({"kind": "expansion_failed", "workers": sorted(roles)})
        return ok

    async def on_worker_failed(self, slot_id: SlotId) -> bool:
        """A worker's process died: mark its slot failed; if it was serving, take it out
        now (as an urgent shrink: its cut turns resume on the survivors). A dedicated slot
        still in the budget gets a fresh worker in the background (admitted as any
        expansion); an overlap slot gets a fresh retained process for the next borrowing
        round. False if the slot was not in service (already out, reported twice, or still
        joining: its start fails and is retried)."""
        async with self._lock:
            overlap = self.toggle is not None and slot_id in self.toggle.overlap
            if self.table.snapshot().slot(slot_id).status is WorkerStatus.FAILED or not (
                overlap or slot_id in self.rebuilder.workers
            ):
                return False  # already out (stopped by a shrink, or reported twice)
            self.failures += 1
            if slot_id in self.rebuilder.workers:  # serving: out now, its turns resume
                survivors = set(self.rebuilder.workers) - {slot_id}
                roles = self._roles_for(survivors)
                self.log({"kind": "failure", "slot": slot_id, "roles": _labels(roles)})
                self.table.set_status(slot_id, WorkerStatus.FAILED)  # until restarted
                await self.rebuilder.shrink([slot_id], roles)
            else:  # a retained overlap process, idle between borrowing rounds
                self.log({"kind": "failure", "slot": slot_id, "roles": None})
                self.table.set_status(slot_id, WorkerStatus.FAILED)
            if overlap:
                assert self.toggle is not None
                self.log({"kind": "restart", "slot": slot_id, "role": "overlap"})
                self._replacements.add(self.toggle.replace_failed(slot_id))
                return True
            if self._in_budget(slot_id):
                task = asyncio.ensure_future(self._restart(slot_id))
                self._expansions[task] = frozenset({slot_id})
            return True

    def _in_budget(self, slot_id: SlotId) -> bool:
        budget = self.budget_gpus // self.gpus_per_worker
        return slot_id in set(self.reserved) | set(self.preemptible[:budget])

    async def _restart(self, slot_id: SlotId) -> bool:
        """A fresh worker for a failed dedicated slot, admitted as any expansion. A start
        that fails too (its process died again, or found no place: a lost machine's slots
        are restarted wherever the cluster has room) is retried ``RESTART_ATTEMPTS`` times,
        ``RESTART_BACKOFF_S`` apart, while the slot is still in the budget and out."""
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            if attempt > 1:
                await self.clock.sleep(RESTART_BACKOFF_S)
                if not self._in_budget(slot_id) or slot_id in self.rebuilder.workers:
                    return False
            guess = self._roles_for(set(self.rebuilder.workers) | {slot_id})
            event = {"kind": "restart", "slot": slot_id, "role": str(guess[slot_id])}
            self.log(event | ({"attempt": attempt} if attempt > 1 else {}))
            if await self._expand({slot_id: guess[slot_id]}):
                return True
        return False

    async def replay(self, changes: list[tuple[float, int]], until: float | None = None) -> None:
        """Feed ``(time, preemptible GPUs)`` changes at their times (relative to now)."""
        start = self.clock.now()
        for at, gpus in changes:
            if until is not None and at >= until:
                break
            await self.clock.sleep(max(0.0, start + at - self.clock.now()))
            await self.on_availability(gpus)

    async def settle(self) -> None:
        """Wait for the background expansions and replacements to finish (end of a run)."""
        for task in list(self._replacements):
            await task
        self._replacements.clear()
        for task in list(self._expansions):
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._expansions.clear()

    # -- pipeline hooks ----------------------------------------------------------------
    async def on_rollout_finished(self, step: int, result: BatchResult) -> None:
        """Refit the model from the finished batch and re-decide the roles."""
        if self.tracker is not None:
            if self.toggle is not None:
                # What borrowing bought, measured: this batch against the model's prediction
                # for the dedicated workers (before the refit, as the gate saw it).
                n_ded = len(set(self.rebuilder.workers) - set(self.toggle.overlap))
                predicted = self.decider.best_makespan(n_ded)
                if predicted is not None:
                    self.tracker.observe_borrowing(
                        result.makespan_s, predicted, borrowed=self.toggle.borrowed
                    )
            params = self.tracker.end_step(len(result.trajectories), result.makespan_s)
            report = {k: v.to_dict() for k, v in self.tracker.fit_report.items()}
            self.log({"kind": "refit", "step": step, "params": _params(params), "fit": report})
        if self.decider.policy.pd in (PDMode.ADAPTIVE, PDMode.DISAGGREGATED):
            async with self._lock:
                await self._reassign(self._roles_for(self.rebuilder.workers), "refit")

    async def on_training_begin(self, step: int) -> None:
        """Mandatory return of borrowed training GPUs (with the dedicated workers' roles)."""
        if self.toggle is None or not self.toggle.borrowed:
            return
        async with self._lock:
            dedicated = set(self.rebuilder.workers) - set(self.toggle.overlap)
            roles = self._roles_for(dedicated)
            self.log({"kind": "give_back", "step": step, "roles": _labels(roles)})
            await self.toggle.give_back(roles)
            if self.tracker is not None and self.toggle.toggle_seconds:
                self.tracker.observe_toggle(
                    self.toggle.toggle_seconds[-1], self.toggle.return_seconds[-1]
                )

    async def on_training_finished(self, step: int, weight_version: int) -> None:
        """Borrow the overlap zone for the rest of the rollout batch, if it pays."""
        policy = self.decider.policy
        if self.toggle is None or policy.borrowing is Borrowing.OFF:
            return
        if policy.borrowing is Borrowing.GATED and not self._gate(step):
            self.toggle.skipped_by_gate += 1
            return
        async with self._lock:

            def at_admission(workers: list[SlotId]) -> dict[SlotId, WorkerRole]:
                return self._roles_for(workers)

            self.log({"kind": "borrow", "step": step, "workers": sorted(self.toggle.overlap)})
            borrowed = await self.toggle.borrow(at_admission)
            if borrowed and self._probing:
                self._probed = True

    def _gate(self, step: int) -> bool:
        """``(R/B) * (T_ded - T_full) > T_toggle`` from the refitted model. Before the first
        refit nothing can be predicted: borrow only if the window is a whole batch (the
        start of the run, when the trainer idles until the first batch is rolled out)."""
        assert self.toggle is not None  # only asked when borrowing is possible
        self._probing = False
        n_ded = len(set(self.rebuilder.workers) - set(self.toggle.overlap))
        t_ded = self.decider.best_makespan(n_ded)
        t_full = self.decider.best_makespan(n_ded + len(self.toggle.overlap))
        R, B = self.progress()
        if t_ded is None or t_full is None:
            ok = R >= B
            reason = "no measurements yet"
            self.log({"kind": "gate", "step": step, "R": R, "B": B, "borrow": ok, "reason": reason})
            return ok
        lat = self.tracker.toggle_cost_s.value if self.tracker is not None else None
        t_toggle = lat if lat is not None else self.toggle.activate_s + self.toggle.deactivate_s
        by_model = borrow_gate(R, B, t_ded, t_full, t_toggle)
        # The paper's formula is the prior; once batches with and without borrowing were
        # both measured, what borrowing actually saved replaces the model's (T_ded - T_full).
        # A measured saving is net of the activation (the overlap workers joined late in
        # those batches) and of how late in a batch borrowing starts: only the give-back,
        # paid before training begins, is still to be charged against it.
        saving = self.tracker.measured_borrow_saving() if self.tracker is not None else None
        t_return = self.tracker.return_cost_s.value if self.tracker is not None else None
        if t_return is None:
            t_return = self.toggle.deactivate_s
        ok = by_model if saving is None else saving * t_ded > t_return
        # The model cannot see what borrowed workers take off the dedicated ones (their
        # prefill, the tail of the batch), and a closed gate never measures it: once a
        # batch without borrowing has been measured, borrow one round against the model so
        # that the measured saving decides from then on. It costs one round's handoff
        # where borrowing does not pay.
        probe = (
            not ok
            and saving is None
            and not self._probed
            and 2 * R >= B  # most of the batch to go: a measurement of borrowing, not of a tail
            and self.tracker is not None
            and self.tracker.makespan_ratio_dedicated.value is not None
        )
        self._probing, ok = probe, ok or probe
        self.log(
            {
                "kind": "gate",
                "step": step,
                "R": R,
                "B": B,
                "T_ded": t_ded,
                "T_full": t_full,
                "T_toggle": t_toggle,
                "borrow_by_model": by_model,
                "measured_saving": saving,
                "T_return": t_return,
                "probe": probe,
                "borrow": ok,
            }
        )
        return ok


def _labels(roles: Mapping[SlotId, WorkerRole]) -> dict[str, str]:
    return {str(s): str(r) for s, r in sorted(roles.items())}


def _params(p) -> dict[str, float]:
    return {name: getattr(p, name) for name in p.__dataclass_fields__}
