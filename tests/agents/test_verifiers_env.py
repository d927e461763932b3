"""A real verifiers environment (TextArena's Hangman, ``verifiers==0.4.0`` in
``.venv-verifiers``, made by ``scripts/verifiers_env.sh``) through the real endpoint with a
scripted model: one trajectory on the sampled ids, the game's own reward, failures that end
the episode, and the split of tasks between training and held-out seeds."""

import dataclasses
import os
import re
from pathlib import Path

import pytest
from test_endpoint import chat, run_agents  # noqa: F401 (chat: the fixture)

from pearl.agents.examples import verifiers_env
from pearl.agents.examples.verifiers_env import task_index
from pearl.envs.base import HELDOUT_START
from pearl.models.chat import ChatFormat
from pearl.sim.worker import SimulatedWorker

VENV_PYTHON = Path(verifiers_env.__file__).resolve().parents[4] / ".venv-verifiers/bin/python"
needs_verifiers = pytest.mark.skipif(
    not VENV_PYTHON.exists(), reason="no .venv-verifiers (bash scripts/verifiers_env.sh)"
)
LETTERS = "EARIOTNSLCUDPMHGBFYWKVXZJQ"  # English letter frequency


class HangmanModel(SimulatedWorker):
    """Plays Hangman as a model would: the most frequent letter it has not guessed yet, in
    the game's ``[L]`` format (its replies replace the sampled stand-ins; the tiny tokenizer
    is byte-level, so any text is tokens)."""

    chat: ChatFormat

    async def generate(self, turn):
        out = await super().generate(turn)
        tok = self.chat.tokenizer
        said = tok.decode(turn.token_ids).split("<|im_start|>assistant\n")[1:]
        guessed = {m.group(1) for text in said if (m := re.match(r"Guess: \[(\w)\]", text))}
        letter = next(c for c in LETTERS if c not in guessed)
        ids = [*tok.encode(f"Guess: [{letter}]"), self.chat.end_id]
        return dataclasses.replace(out, token_ids=ids, logprobs=[-0.5] * len(ids))


def _processes_with(text: str) -> list[int]:
    """The processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # a process per episode: verifiers' import, its harness relaunched per turn
@needs_verifiers
def test_a_verifiers_game_is_one_trajectory_on_the_sampled_ids_with_the_games_reward(
    chat,  # noqa: F811
):
    """The null harness resends the conversation as it got it, so the endpoint sees one
    conversation: one segment, the trained ids are the turns' ids, and the reward is the
    game's (1 for a win, else the share of the word uncovered, as its outcome says)."""
    got = {}

    async def agent(seed, c):
        got[seed] = await verifiers_env.solve(seed, c, train_tasks=100)
        return got[seed]

    model = type("Model", (HangmanModel,), {"chat": chat})
    results, endpoint, events = run_agents(
        chat, agent, episodes=2, worker=model, max_new_tokens=32, max_context=32768, timeout_s=120
    )
    assert events == []
    for seed, t in enumerate(results):
        assert t.stop_reason == "done" and t.extra_samples == []
        assert t.reward == got[seed]["reward"] and t.sample.success == got[seed]["success"]
        assert len(t.turns) == got[seed]["turns"] >= 2
        outcome = got[seed]["info"][0]["game_outcome"]
        share = re.search(r"You guessed ([0-9.]+) percentage", outcome)
        assert t.reward == pytest.approx(float(share.group(1)) / 100 if share else 1.0, abs=1e-4)
        assert t.sample.success == ("Congratulations" in outcome)
        sample = t.sample
        trained = [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
        assert trained == [i for out in t.turns for i in out.token_ids]
        text = chat.tokenizer.decode(list(sample.token_ids))
        assert "You are playing Hangman" in text and text.count("Guess: [") == len(t.turns)


@pytest.mark.slow  # a process per episode: verifiers' import, its harness relaunched per turn
@needs_verifiers
def test_an_environment_that_fails_ends_its_episode_with_its_message(chat):  # noqa: F811
    async def agent(seed, c):
        return await verifiers_env.solve(seed, c, env={"taskset": {"id": "no_such_taskset"}})

    (t,), _, events = run_agents(chat, agent, timeout_s=120)
    assert t.stop_reason == "env_error" and t.reward == 0.0
    assert "VerifiersEpisodeError" in t.error and "no_such_taskset" in t.error
    assert events and events[0]["kind"] == "env_error"


@pytest.mark.slow  # a process per episode: verifiers' import, its harness relaunched per turn
@needs_verifiers
def test_an_episode_past_its_timeout_leaves_no_process(chat):  # noqa: F811
    """PEARL's episode timeout cancels solve, which stops the episode process and what it
    started (its harness)."""
    urls = []

    async def agent(seed, c):
        urls.append(c.base_url)
        return await verifiers_env.solve(seed, c)

    model = type("Model", (HangmanModel,), {"chat": chat})
    (t,), _, _ = run_agents(chat, agent, worker=model, max_context=32768, timeout_s=2.0)
    assert t.stop_reason == "env_timeout"
    assert _processes_with(urls[0]) == []


def test_held_out_seeds_play_tasks_no_training_seed_plays():
    for size in (None, 50):
        train = {task_index(s, HELDOUT_START, 40, size) for s in range(500)}
        more = {task_index(2 * HELDOUT_START + s, HELDOUT_START, 40, size) for s in range(500)}
        heldout = {task_index(HELDOUT_START + s, HELDOUT_START, 40, size) for s in range(500)}
        assert train == more == set(range(40))
        assert heldout.isdisjoint(train)
        assert heldout == (set(range(40, 540)) if size is None else set(range(40, 50)))
    with pytest.raises(ValueError, match="train_tasks must be between 1 and 49"):
        task_index(0, HELDOUT_START, 50, 50)


def test_without_the_verifiers_venv_the_episode_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.delenv("PEARL_VERIFIERS_PYTHON", raising=False)
    monkeypatch.setattr(verifiers_env, "VENV", str(tmp_path / "nowhere"))
    with pytest.raises(verifiers_env.VerifiersEpisodeError, match="scripts/verifiers_env.sh"):
        verifiers_env._venv_python(None)
    assert os.environ.get("PEARL_VERIFIERS_PYTHON") is None
