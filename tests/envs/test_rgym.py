"""reasoning-gym datasets as multi-turn tasks: the dataset's checker scores, a wrong answer
gets feedback and another try, held-out seeds come from other generator seeds."""

import asyncio

import pytest

pytest.importorskip("reasoning_gym")

from pearl.envs import make_env  # noqa: E402
from pearl.envs.base import HELDOUT_START  # noqa: E402
from pearl.errors import ConfigError  # noqa: E402


def play(env, seed, *actions):
    async def main():
        question = await env.reset(seed)
        return question, [await env.step(a) for a in actions]

    return asyncio.run(main())


def test_a_right_answer_ends_with_the_checkers_full_score():
    env = make_env("reasoning_gym", dataset="chain_sum", config={"min_terms": 2, "max_terms": 2})
    question, (result,) = play(env, 3, f"<answer>{env.dataset[3]['answer']}</answer>")
    assert question == env.dataset[3]["question"] and question.count("+") + question.count("-") == 1
    assert (result.reward, result.done, env.success) == (1.0, True, True)


def test_a_wrong_answer_gets_feedback_and_another_try():
    env = make_env("reasoning_gym", dataset="chain_sum", max_tries=3)
    right = env.dataset[5]["answer"]
    _, (missing, wrong, last) = play(
        env, 5, "it is 7", "<answer>-99999</answer>", "<answer>x</answer>"
    )
    assert "inside <answer></answer>. 2 tries left" in missing.observation and not missing.done
    assert "checker scores it 0.00" in wrong.observation and "1 tries left" in wrong.observation
    assert (wrong.reward, wrong.done) == (0.0, False)
    assert (last.reward, last.done, env.success) == (0.0, True, False)
    _, (late,) = play(env, 5, f"<answer>{right}</answer>")  # a new episode on the same env
    assert late.reward == 1.0


def test_heldout_items_come_from_other_generator_seeds():
    env = make_env("reasoning_gym", dataset="chain_sum")
    train = {env.dataset[s]["question"] for s in range(200)}
    heldout = [env.dataset[HELDOUT_START + s]["question"] for s in range(200)]
    assert sum(q in train for q in heldout) < 20  # a few small sums recur by chance


def test_bad_datasets_and_configs_are_named():
    with pytest.raises(ConfigError, match="'no_such_task' is not a reasoning-gym dataset; choose"):
        make_env("reasoning_gym", dataset="no_such_task")
    with pytest.raises(ConfigError, match="rejected its config"):
        make_env("reasoning_gym", dataset="chain_sum", config={"colour": 3})
    with pytest.raises(ConfigError, match="dataset"):
        make_env("reasoning_gym")  # the dataset option is required


def test_the_demonstration_shows_solved_items_from_neither_split():
    env = make_env("reasoning_gym", dataset="chain_sum", shots=2)
    (u1, a1), (u2, _) = env.demonstration[:2], env.demonstration[2:]
    assert u1[0] == "user" and a1 == (
        "assistant",
        f"<answer>{env.dataset[1 << 30]['answer']}</answer>",
    )
    assert u2[1] == env.dataset[(1 << 30) + 1]["question"]
    assert make_env("reasoning_gym", dataset="chain_sum", shots=0).demonstration == ()
