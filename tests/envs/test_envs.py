"""Environments: a safe arithmetic parser, the calculator and guessing tasks, seed splits."""

import asyncio
from fractions import Fraction

import pytest

from pearl.envs import make_env, split_seed
from pearl.envs.arith import ArithmeticInputError, evaluate, format_number, parse_number
from pearl.envs.calculator import CalculatorEnv, Problem


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    "text,value",
    [
        ("347 * 29", 10063),
        ("(2 + 3) * -4", -20),
        ("7 / 2", Fraction(7, 2)),
        ("2 ** 10", 1024),
        ("1,234 + 1", 1235),
        ("12 x 3", 36),
        ("17 // 5 + 17 % 5", 5),
    ],
)
def test_arithmetic_is_exact(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize(
    "text,reason",
    [
        ("__import__('os').system('true')", "only numbers"),
        ("abs(-3)", "only numbers"),
        ("(1).real", "only numbers"),
        ("1 / 0", "division by zero"),
        ("2 ** 100", "exponents"),
        ("10 ** 12 * 10 ** 12", "exceeds"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("1+" * 100 + "1", "longer than"),
        ("[1, 2]", "cannot parse"),  # commas are thousands separators: "[1 2]"
        ("[1]", "only numbers"),
        ("1 < 2", "only numbers"),
    ],
)
def test_arithmetic_rejects_anything_else_with_a_reason(text, reason):
    with pytest.raises(ArithmeticInputError, match=reason):
        evaluate(text)


def test_numbers_parse_and_format():
    assert parse_number(" -1,234 ") == -1234
    assert parse_number("3.50") == Fraction(7, 2)
    assert parse_number("1e9999999") is None  # no exponent notation: never a huge number
    assert parse_number("twelve") is None
    assert format_number(Fraction(7, 2)) == "3.5" and format_number(Fraction(10063)) == "10063"


def test_calculator_episode_with_the_tool():
    env = CalculatorEnv(level="medium", max_turns=3)
    first = run(env.reset(5))
    problem = Problem.of(5, "medium")
    assert problem.text in first
    step = run(env.step(f"Let me compute. <calc>{problem.text}</calc>"))
    assert not step.done and step.reward == 0 and step.observation == f"Result: {problem.answer}"
    step = run(env.step(f"<answer>{problem.answer}</answer>"))
    assert step.done and step.reward == 1.0 and env.success


def test_calculator_explains_malformed_actions_and_ends_after_max_turns():
    env = CalculatorEnv(level="easy", max_turns=3, format_reward=0.1)
    run(env.reset(0))
    step = run(env.step("I think it is 42"))
    assert not step.done and "<calc>" in step.observation and "<answer>" in step.observation
    step = run(env.step("<calc>import os</calc>"))
    assert not step.done and step.observation.startswith("Calculator error:")
    step = run(env.step("<answer>forty</answer>"))  # third turn: last
    assert step.done and step.reward == 0 and not env.success
    env = CalculatorEnv(level="easy")
    run(env.reset(0))
    wrong = Problem.of(0, "easy").answer + 1
    step = run(env.step(f"<answer>{wrong}</answer>"))
    assert step.done and step.reward == 0.1 and not env.success


def test_single_turn_calculator_has_no_tool():
    env = CalculatorEnv(level="easy", max_turns=1)
    run(env.reset(3))
    step = run(env.step("<calc>1+1</calc>"))
    assert step.done and step.reward == 0 and "<answer>" in step.observation


def test_guess_gives_higher_lower_and_rewards_finding_it():
    env = make_env("guess", high=16, max_turns=5)
    run(env.reset(7))
    low, high = 1, 16
    for _ in range(5):  # binary search finds any number in 1-16 within 5 guesses
        mid = (low + high) // 2
        step = run(env.step(f"<guess>{mid}</guess>"))
        if step.done:
            break
        if step.observation.startswith("Higher"):
            low = mid + 1
        else:
            assert step.observation.startswith("Lower")
            high = mid - 1
    assert step.done and step.reward == 1.0 and env.success
    env = make_env("guess", high=16, max_turns=2)
    run(env.reset(7))
    assert "whole number" in run(env.step("maybe 3?")).observation
    assert run(env.step("<guess>2.5</guess>")).done and not env.success


def test_seeds_split_into_disjoint_train_and_heldout_ranges():
    train = {split_seed("train", i) for i in range(1000)}
    heldout = {split_seed("heldout", i) for i in range(1000)}
    more = {split_seed("train-more", i) for i in range(1000)}  # dynamic sampling's rounds
    assert not train & heldout and not more & (train | heldout)
    with pytest.raises(ValueError, match="split"):
        split_seed("test", 0)
    # The same seed is the same task; tasks vary with the seed.
    assert Problem.of(11, "hard") == Problem.of(11, "hard")
    assert len({Problem.of(s, "hard").text for s in range(50)}) == 50


def test_make_env_rejects_unknown_names_and_options():
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        make_env("chess")
    with pytest.raises(ValueError, match="level must be one of"):
        make_env("calculator", level="impossible")
    with pytest.raises(ValueError, match="environment 'guess'.*colour"):
        make_env("guess", colour="red")


@pytest.mark.parametrize("name", ["calculator", "guess"])
def test_every_environment_shows_a_demonstration_of_its_format(name):
    env = make_env(name)
    assert env.demonstration and all(
        role in ("user", "assistant") and text for role, text in env.demonstration
    )
    assert env.demonstration[-1][0] in ("user", "assistant") and env.system_prompt
