"""Workload profiles: the shape of an agentic workload (tasks, group size, turns,
observation and response lengths, environment latency, context cap) and the shipped
catalog.

Profile defaults cite the team's survey of published agentic workloads, docs/workloads.md (its
sources are named next to each value; "M" = measured in the source,
"E" = estimate built on them); every one can be overridden with
``dataclasses.replace`` or :func:`profile_from_dict`. A workload profile is not a cost
profile (``pearl.sim.cost_profile``: fitted hardware constants)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from pearl.errors import ConfigError
from pearl.workloads.batch import _is_int
from pearl.workloads.distributions import (
    Choice,
    Dist,
    Fixed,
    LogNormal,
    Mixture,
    Uniform,
    UniformInt,
    _check,
)


@dataclass(slots=True, frozen=True)
class AgenticProfile:
    """The distributions a workload draws trajectories from; token counts are rounded to ints.

    Attributes:
        name: profile name, also the task-id prefix.
        max_context_tokens: a trajectory stops before its context would pass this.
        group_size: trajectories per task (G).
        num_tasks: tasks per rollout batch (B = num_tasks x group_size).
        turns: planned turns per trajectory (rounded, clipped to [min_turns, max_turns]).
        min_turns, max_turns: turn clip; reaching max_turns ends with StopReason.MAX_TURNS.
        shared_prefix_tokens: system/tool prompt identical for all tasks (same token ids).
        task_prompt_tokens: task-specific part of the initial prompt (issue, question).
        max_prompt_tokens: cap on the whole initial prompt; the task part is clipped to fit.
        response_tokens: tokens generated per turn (>= 1).
        observation_tokens: tokens the environment appends per turn after turn 0 (>= 1).
        env_latency_s: environment time after a response (tool call, retrieval, action).
        env_overhead_s: fixed per-action sandbox overhead added to every env latency.
        env_timeout_s: env latency (before the overhead) is clipped here; None = no timeout.
        env_setup_s: per-trajectory environment start (container/VM) before turn 0.
        reward_latency_s: per-trajectory reward evaluation after the last turn.
        kept_response_tokens: None keeps whole responses; otherwise thinking is stripped and
            only min(response, draw) final tokens (the action) stay in the next context.
        image_tokens: tokens of one screenshot, drawn once per task (a task has one screen
            resolution); added to the initial prompt and to every observation. None = text only.
        observation_window: keep only the last N observations whole (the prompt always);
            older ones collapse to ``collapsed_observation_tokens`` (SWE-agent's
            last_n_observations). Every collapse edits the context, so the engine re-prefills
            from the collapsed observation on. None = keep everything.
        description: one line on what the profile models and where its numbers come from.
    """

    name: str
    max_context_tokens: int
    group_size: int
    num_tasks: int
    turns: Dist
    min_turns: int
    max_turns: int
    shared_prefix_tokens: int
    task_prompt_tokens: Dist
    max_prompt_tokens: int
    response_tokens: Dist
    observation_tokens: Dist
    env_latency_s: Dist
    env_overhead_s: float = 0.0
    env_timeout_s: float | None = None
    env_setup_s: Dist = Fixed(0.0)
    reward_latency_s: Dist = Fixed(0.0)
    kept_response_tokens: Dist | None = None
    image_tokens: Dist | None = None
    observation_window: int | None = None
    collapsed_observation_tokens: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        _check(bool(self.name), "AgenticProfile.name must be non-empty")
        for field in ("group_size", "num_tasks", "min_turns"):
            value = getattr(self, field)
            _check(
                _is_int(value) and value >= 1,
                f"AgenticProfile({self.name}).{field} must be an int >= 1, got {value!r}",
            )
        _check(
            _is_int(self.max_turns) and self.max_turns >= self.min_turns,
            f"AgenticProfile({self.name}).max_turns must be an int >= min_turns "
            f"({self.min_turns}), got {self.max_turns!r}",
        )
        _check(
            _is_int(self.shared_prefix_tokens) and self.shared_prefix_tokens >= 0,
            f"AgenticProfile({self.name}).shared_prefix_tokens must be an int >= 0, "
            f"got {self.shared_prefix_tokens!r}",
        )
        _check(
            _is_int(self.max_prompt_tokens) and self.max_prompt_tokens > self.shared_prefix_tokens,
            f"AgenticProfile({self.name}).max_prompt_tokens must be an int > "
            f"shared_prefix_tokens ({self.shared_prefix_tokens}), got {self.max_prompt_tokens!r}",
        )
        _check(
            _is_int(self.max_context_tokens) and self.max_context_tokens > self.max_prompt_tokens,
            f"AgenticProfile({self.name}).max_context_tokens must be an int > max_prompt_tokens "
            f"({self.max_prompt_tokens}) so turn 0 can generate, got {self.max_context_tokens!r}",
        )
        _check(
            self.env_overhead_s >= 0,
            f"AgenticProfile({self.name}).env_overhead_s must be >= 0, got {self.env_overhead_s!r}",
        )
        _check(
            self.env_timeout_s is None or self.env_timeout_s > 0,
            f"AgenticProfile({self.name}).env_timeout_s must be > 0 or None, "
            f"got {self.env_timeout_s!r}",
        )

    @property
    def batch_size(self) -> int:
        """B = num_tasks x group_size."""
        return self.num_tasks * self.group_size


def _swe(thinking: bool = False) -> AgenticProfile:
    # Every number below: docs/workloads.md, section SWE, unless marked otherwise.
    return AgenticProfile(
        name="swe_thinking" if thinking else "swe",
        # PEARL's evaluation (docs/paper.md "How it was evaluated"): 32K max trajectory, G=16, batch 64.
        max_context_tokens=32_768,
        group_size=16,
        num_tasks=4,
        # E: "turns LogNormal(median 25, sigma 0.75) clipped to [3, cap] (mean ~33)"; measured
        # means 16-64 (nebius Table 1). Cap 100: NeMo Gym SWE RL <= 100 turns, OpenHands cap 100.
        turns=LogNormal(median=25, sigma=0.75),
        min_turns=3,
        max_turns=100,
        # E: "initial prompt 1.5-3K system/tools + issue LogNormal(median 400, sigma 0.8),
        # total <= 4,096" (4,096 = DeepSWE/rLLM prompt limit, M).
        shared_prefix_tokens=2_048,
        task_prompt_tokens=LogNormal(median=400, sigma=0.8, low=1),
        max_prompt_tokens=4_096,
        # E: actions LogNormal(150, 0.8) without thinking, (900, 0.9) with, capped 2,048-8,192
        # (ROLL: 2,048 tokens per step, M).
        response_tokens=(
            LogNormal(median=900, sigma=0.9, low=1, high=8_192)
            if thinking
            else LogNormal(median=150, sigma=0.8, low=1, high=2_048)
        ),
        # With thinking the scaffold keeps only the action (Qwen3's chat template drops
        # earlier turns' thoughts); the action follows the non-thinking action length.
        kept_response_tokens=LogNormal(median=150, sigma=0.8, low=1, high=2_048)
        if thinking
        else None,
        # E: observations LogNormal(750, 1.4) truncated at 2.5-10K; tracelab appended tokens
        # per step p50 710-954, p90 3.1-6.1K, p99 10-31K (M). The 10K cap keeps p90 ~4.5K in that
        # range; 2,500 (mini-swe-agent's 10,000 chars at ~4 chars/token) is the strict scaffold.
        observation_tokens=LogNormal(median=750, sigma=1.4, low=1, high=10_000),
        # E: 0.3 s fixed (sandbox overhead 0.26-0.6 s per action, Daytona, M) + 90% commands
        # LogNormal(0.4 s, 1.0) and 10% test runs LogNormal(15 s, 1.0).
        env_overhead_s=0.3,
        env_latency_s=Mixture(
            components=(LogNormal(median=0.4, sigma=1.0), LogNormal(median=15.0, sigma=1.0)),
            weights=(0.9, 0.1),
        ),
        # M: ROLL shell timeout 360 s (mini-swe-agent: 60 s).
        env_timeout_s=360.0,
        # E: setup LogNormal(3 s, 0.7) (cold start 2-5 s, M) with a 5% cold image pull U(30, 300) s.
        env_setup_s=Mixture(
            components=(LogNormal(median=3.0, sigma=0.7), Uniform(30.0, 300.0)),
            weights=(0.95, 0.05),
        ),
        # E: reward evaluation LogNormal(30 s, 1.0), clipped at the 1,200 s test timeout (M: R2E-Gym).
        reward_latency_s=LogNormal(median=30.0, sigma=1.0, high=1_200.0),
        description="SWE-bench-like coding agent (docs/workloads.md SWE; PEARL's 32K / G16 / B64 setting)",
    )


def _gui() -> AgenticProfile:
    # Every number below: docs/workloads.md, section GUI, unless marked otherwise.
    return AgenticProfile(
        name="gui",
        max_context_tokens=32_768,  # E: PEARL's setting; 15 steps x (2.7K + text) fit.
        group_size=16,  # E: PEARL's GRPO setting.
        num_tasks=4,
        # E: steps LogNormal(median 10, sigma 0.6), cap 15 (ARPO/OSWorld training cap, M).
        turns=LogNormal(median=10, sigma=0.6),
        min_turns=1,
        max_turns=15,
        # E (not in docs/workloads.md): computer-use system prompt with the action space ~1K tokens;
        # instruction LogNormal(median 60, sigma 0.5); the first screenshot joins the prompt.
        shared_prefix_tokens=1_024,
        task_prompt_tokens=LogNormal(median=60, sigma=0.5, low=1),
        max_prompt_tokens=4_096,
        # E: action LogNormal(median 100, sigma 0.6) (median 400 with a thought).
        response_tokens=LogNormal(median=100, sigma=0.6, low=1, high=1_024),
        # M (D): Qwen2.5-VL one token per 28x28 pixels, ~1K (1280x720) to ~2.7K (1920x1080).
        # Modelled append-only: each turn appends one new screenshot + text; the scaffold's
        # 5-screenshot history window (which would drop old images) is not modelled, so late
        # contexts are over-estimated by the dropped screenshots.
        image_tokens=Uniform(1_000.0, 2_700.0),
        # E: accessibility/status text per observation besides the screenshot.
        observation_tokens=LogNormal(median=50, sigma=0.5, low=1, high=1_000),
        # E: action + screenshot 1-3 s.
        env_latency_s=Uniform(1.0, 3.0),
        # E: VM reset Uniform(10, 60) s.
        env_setup_s=Uniform(10.0, 60.0),
        # E (not in docs/workloads.md): OSWorld evaluator scripts, a few seconds.
        reward_latency_s=LogNormal(median=5.0, sigma=0.7),
        description="OSWorld-like computer-use agent (docs/workloads.md GUI)",
    )


def _search() -> AgenticProfile:
    # Every number below: docs/workloads.md, section Search, unless marked otherwise.
    return AgenticProfile(
        name="search",
        # M: Search-R1 train_grpo.sh total 4,096 tokens, start prompt 2,048.
        max_context_tokens=4_096,
        group_size=16,  # E: PEARL's GRPO setting (Search-R1 uses 5).
        num_tasks=4,
        # E: searches {0: .10, 1: .40, 2: .35, 3: .15}, turns = searches + 1.
        turns=Choice(values=(1, 2, 3, 4), weights=(0.10, 0.40, 0.35, 0.15)),
        min_turns=1,
        max_turns=4,
        # E (not in docs/workloads.md): Search-R1's instruction template ~150 tokens.
        shared_prefix_tokens=150,
        # E: prompt LogNormal(median 250, sigma 0.4) in total; split as the shared 150 plus a
        # question LogNormal(100, 0.8), which keeps the total's median 250 and p10/p90 ~186/428
        # (the suggested total gives 150/417).
        task_prompt_tokens=LogNormal(median=100, sigma=0.8, low=1),
        max_prompt_tokens=2_048,
        # E: response LogNormal(median 150, sigma 0.6) capped 500 (M: 500 per turn).
        response_tokens=LogNormal(median=150, sigma=0.6, low=1, high=500),
        # E: top-3 passages ~400 tokens, <= 500 (M).
        observation_tokens=LogNormal(median=400, sigma=0.15, low=1, high=500),
        # E: retrieval LogNormal(median 30 ms, sigma 0.5).
        env_latency_s=LogNormal(median=0.03, sigma=0.5),
        # E: exact-match reward is computed in process: no setup, negligible reward time.
        description="Search-R1-style retrieval QA (docs/workloads.md Search)",
    )


def _game() -> AgenticProfile:
    # Not in docs/workloads.md: an estimate (E) of text games / multi-turn puzzles (Sokoban,
    # FrozenLake, Wordle style), chosen to stress many short turns.
    return AgenticProfile(
        name="game",
        max_context_tokens=8_192,
        group_size=16,
        num_tasks=4,
        turns=UniformInt(10, 40),
        min_turns=1,
        max_turns=50,  # E: a scaffold cap above the natural 10-40
        shared_prefix_tokens=256,  # E: rules of the game
        task_prompt_tokens=UniformInt(50, 300),  # E: initial board/state
        max_prompt_tokens=1_024,
        response_tokens=UniformInt(5, 30),  # E: one move
        observation_tokens=UniformInt(20, 80),  # E: new state + feedback
        env_latency_s=Uniform(0.01, 0.1),  # E: in-process step, 10-100 ms
        env_setup_s=Uniform(0.05, 0.2),  # E: reset a game
        description="short-turn game (estimate): 10-40 turns of 20-80 observation, 5-30 response tokens",
    )


def scaled(
    profile: AgenticProfile,
    token_factor: float = 1.0,
    time_factor: float = 1.0,
    name: str | None = None,
) -> AgenticProfile:
    """``profile`` with every token quantity times ``token_factor`` and every time times ``time_factor``.

    Turn counts and group/batch sizes are unchanged; use ``dataclasses.replace`` for those.
    """
    _check(
        token_factor > 0 and time_factor > 0,
        f"scaled() factors must be > 0, got token_factor={token_factor} time_factor={time_factor}",
    )

    def tok(n: int) -> int:
        return max(1, round(n * token_factor))

    def opt(d: Any, f: float) -> Any:
        return None if d is None else d.scaled(f)

    shared = 0 if profile.shared_prefix_tokens == 0 else tok(profile.shared_prefix_tokens)
    max_prompt = max(shared + 1, tok(profile.max_prompt_tokens))
    return dataclasses.replace(
        profile,
        name=name or f"{profile.name}_x{token_factor:g}",
        max_context_tokens=max(max_prompt + 1, tok(profile.max_context_tokens)),
        shared_prefix_tokens=shared,
        task_prompt_tokens=profile.task_prompt_tokens.scaled(token_factor),
        max_prompt_tokens=max_prompt,
        response_tokens=profile.response_tokens.scaled(token_factor),
        observation_tokens=profile.observation_tokens.scaled(token_factor),
        kept_response_tokens=opt(profile.kept_response_tokens, token_factor),
        image_tokens=opt(profile.image_tokens, token_factor),
        env_latency_s=profile.env_latency_s.scaled(time_factor),
        env_overhead_s=profile.env_overhead_s * time_factor,
        env_timeout_s=None
        if profile.env_timeout_s is None
        else profile.env_timeout_s * time_factor,
        env_setup_s=profile.env_setup_s.scaled(time_factor),
        reward_latency_s=profile.reward_latency_s.scaled(time_factor),
    )


def _tiny() -> AgenticProfile:
    # SWE's shape at 1/16 of the tokens (contexts up to 2,048) and 1/10 of the times, with
    # 2 tasks x 4: sized for calibration on a 2-core CPU with a 5-30M parameter model.
    return dataclasses.replace(
        scaled(_swe(), token_factor=1 / 16, time_factor=1 / 10, name="tiny"),
        group_size=4,
        num_tasks=2,
        description="SWE shape scaled to 1/16 tokens (2K context), 1/10 time, 2 tasks x 4",
    )


# Fitted to the paper's characterization (docs/regime.md; benchmarks/regime.py measures
# every row). Each value is fitted to the one row named next to it; nothing else is tuned.
# Refitted in issue 60 under the fitted engine and prices (configs/headline_paper.yaml,
# cost profile paper-h800): `benchmarks/regime.py --refit 50 60 70 80 92`.
SWE_PAPER_TURNS_MEDIAN = 80.0  # fitted to C4 (rollout -19.2% from 16 to 32 GPUs)
SWE_PAPER_ENV_SCALE = 0.0459  # fitted to C5 (216.3 s mean trajectory, one per worker)


def swe_paper_profile(
    turns_median: float = SWE_PAPER_TURNS_MEDIAN, env_scale: float = SWE_PAPER_ENV_SCALE
) -> AgenticProfile:
    """``swe_thinking`` in the paper's regime (docs/regime.md): what the paper does not
    state is either cited or fitted to one characterization row. The two fitted values are
    arguments so that ``benchmarks/regime.py --refit`` can refit them; ``swe_paper`` is this
    profile at the shipped values."""
    if not (turns_median > 0 and env_scale >= 0):
        raise ConfigError(
            f"swe_paper: turns_median must be > 0 and env_scale >= 0, got {turns_median!r}, "
            f"{env_scale!r}"
        )
    base = _swe(thinking=True)
    scale = env_scale
    return dataclasses.replace(
        base,
        name="swe_paper",
        # E (docs/workloads.md): turns LogNormal(sigma 0.75) capped at 100; the median is fitted.
        turns=LogNormal(median=turns_median, sigma=0.75),
        # M: coding agents generate ~523 tokens per step (tracelab): LogNormal(350, 0.9) has
        # mean 526. Qwen3's thinking precedes the action and is stripped from later turns,
        # which keep the action (swe_thinking). Cap 8,192 as swe_thinking.
        response_tokens=LogNormal(median=350, sigma=0.9, low=1, high=8_192),
        # M: SWE-agent 0.7 keeps the last 5 observations whole and collapses older ones to
        # "Old environment output: (n lines omitted)" (~10 tokens): last_n_observations n=5.
        observation_window=5,
        collapsed_observation_tokens=10,
        # E (docs/workloads.md) tool, setup and reward latencies, all scaled by one factor fitted
        # to C5: the paper's sandboxes are faster than the suggested distributions.
        env_overhead_s=base.env_overhead_s * scale,
        env_latency_s=base.env_latency_s.scaled(scale),
        env_setup_s=base.env_setup_s.scaled(scale),
        reward_latency_s=base.reward_latency_s.scaled(scale),
        description="SWE-bench coding agent in PEARL's regime (docs/regime.md: cited or fitted "
        "to C4/C5 per parameter)",
    )


_PROFILES = {
    "swe": _swe,
    "swe_thinking": lambda: _swe(thinking=True),
    "swe_paper": swe_paper_profile,
    "gui": _gui,
    "search": _search,
    "game": _game,
    "tiny": _tiny,
}


def profile_names() -> tuple[str, ...]:
    """Names accepted by :func:`get_profile`."""
    return tuple(_PROFILES)


def get_profile(name: str) -> AgenticProfile:
    """The named built-in profile; raises ConfigError listing the valid names."""
    try:
        return _PROFILES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown workload profile {name!r}; valid: {', '.join(_PROFILES)}"
        ) from None


_PROFILE_ADAPTER: pydantic.TypeAdapter[AgenticProfile] | None = None


def profile_from_dict(data: Mapping[str, Any], source: str = "<profile>") -> AgenticProfile:
    """Build a profile from a config mapping; ``base: <name>`` starts from a built-in and overrides.

    Distributions are mappings with a ``kind`` (fixed, uniform, uniform_int, lognormal,
    choice, mixture). Errors raise ConfigError naming ``source`` and the field path.
    """
    global _PROFILE_ADAPTER
    if _PROFILE_ADAPTER is None:
        _PROFILE_ADAPTER = pydantic.TypeAdapter(AgenticProfile)
    merged: dict[str, Any] = dict(data)
    base = merged.pop("base", None)
    if base is not None:
        merged = {**dataclasses.asdict(get_profile(str(base))), **merged}
    try:
        return _PROFILE_ADAPTER.validate_python(merged, strict=False)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ConfigError(
            f"{source}: field {field}: {first['msg']} (got {first.get('input')!r})"
        ) from None


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------
