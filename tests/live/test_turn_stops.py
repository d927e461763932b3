"""A reply ends at the chat format's end of turn and at every end-of-sequence id the model
folder declares (config.json and generation_config.json), whatever the model config's own
EOS is: a tiny ChatML model whose configured EOS (0) is not ``<|im_end|>`` (257) must not
reply past a sampled ``<|im_end|>`` into turns it invents, all trained on."""

import asyncio
import json

import pytest
from tiny_model import CHAT_LLAMA, tiny_chat_tokenizer

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.episode import run_episode
from pearl.envs.base import StepResult
from pearl.errors import ConfigError
from pearl.live.episodes import TextEpisode
from pearl.models.chat import ChatFormat, turn_stop_ids

END = 257  # <|im_end|> in the tiny ChatML tokenizer


@pytest.fixture(scope="module")
def eos0_model(tmp_path_factory):
    from pearl.models.config import ModelConfig
    from pearl.models.loader import build_model, save_model

    folder = tmp_path_factory.mktemp("eos0")
    save_model(
        build_model(ModelConfig.from_dict({**CHAT_LLAMA, "eos_token_id": 0}), seed=0), folder
    )
    tiny_chat_tokenizer(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5]}))
    return folder


class Chatter:
    system_prompt = "sys"
    success = False

    async def reset(self, seed):
        return f"task {seed}"

    async def step(self, action):
        return StepResult("go on", 0.0, False)


class EngineRouter:
    """Turns straight to one in-process engine server (the router's part for one worker)."""

    def __init__(self, server):
        self.server = server

    async def run_turn(self, turn):
        return await self.server.run_turn(turn)

    async def end_session(self, session_id):
        await self.server.release_session(session_id)


def replies(folder, stop_ids, episodes=20):
    from pearl.control.interfaces import AsyncioClock
    from pearl.engine.config import EngineConfig
    from pearl.live.server import EngineServer, ModelSpec

    chat = ChatFormat.from_folder(folder)
    server = EngineServer("w0", ModelSpec(folder=str(folder)), EngineConfig(num_kv_blocks=512))
    config = AgentLoopConfig(vocab_size=300, temperature=1.0, seed=11, stop_token_ids=stop_ids)

    async def main():
        results = await asyncio.gather(
            *(
                run_episode(
                    f"s{i}",
                    TextEpisode(Chatter(), i, chat, "g", None, lambda e: None),
                    EngineRouter(server),
                    AsyncioClock(),
                    config,
                    max_new_tokens=64,
                    max_context_tokens=400,
                    max_turns=2,
                )
                for i in range(episodes)
            )
        )
        return [t.token_ids for r in results for t in r.turns]

    return asyncio.run(main())


def test_stop_ids_are_the_chat_end_and_the_folders_eos_ids(eos0_model, tmp_path):
    chat = ChatFormat.from_folder(eos0_model)
    assert turn_stop_ids(eos0_model, chat, (0,)) == (0, 5, END)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "two"}')
    with pytest.raises(ConfigError, match="not a token id"):
        turn_stop_ids(tmp_path, chat, (0,))


def test_replies_end_at_the_chat_end_token_whatever_the_configured_eos(eos0_model):
    stops = turn_stop_ids(eos0_model, ChatFormat.from_folder(eos0_model), (0,))
    fixed = replies(eos0_model, stops)
    assert all(END not in r[:-1] and 0 not in r[:-1] and 5 not in r[:-1] for r in fixed)
    assert sum(r[-1] == END for r in fixed) >= 3  # it does sample the end token
    # Stopping on config.json's EOS alone (before): replies ran on past a sampled end.
    before = replies(eos0_model, ())
    assert sum(END in r[:-1] for r in before) >= 3


def test_a_model_without_a_chat_end_token_is_refused(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    HFTokenizer(models.BPE(vocab={"a": 0}, merges=[])).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match="not a ChatML model"):
        ChatFormat.from_folder(tmp_path)
