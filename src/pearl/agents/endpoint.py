"""The OpenAI-compatible HTTP endpoint agents call during ``pearl train``.

FastAPI on uvicorn, the pair vLLM's and SGLang's OpenAI servers are built on, runs in the
driver's event loop, next to the router: a call is a coroutine that awaits its turn, with
no thread or process hop. Each episode gets its own base URL,
``http://HOST:PORT/episodes/<key>/v1`` (the key is random and unguessable), so an
unmodified agent needs only ``base_url`` set; ``GET .../v1/models`` lists the one model.

Security: it listens on the loopback interface unless ``host`` says otherwise, and then
it needs an ``api_key``, checked on every request (``Authorization: Bearer``). Bodies over
``max_request_bytes`` are refused before they are read whole; every error is an OpenAI
error object; nothing an agent sends is evaluated (JSON is parsed, templates run sandboxed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import secrets
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from pearl.agents.episode import ClientConfig
from pearl.agents.messages import ApiError, ChatRequest
from pearl.agents.replies import completion_body, stream_chunks
from pearl.errors import ConfigError

if TYPE_CHECKING:
    from pearl.agents.episode import AgentEpisode

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
NO_KEY = "none"  # what agents pass as api_key when the endpoint checks none (SDKs need one)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AgentEndpoint:
    """Serves ``model`` to the open episodes; ``start()`` in the run's event loop."""

    def __init__(
        self,
        model: str,
        host: str = LOOPBACK,
        port: int = 0,
        api_key: str | None = None,
        max_request_bytes: int = 4 << 20,
    ) -> None:
        if not is_loopback(host) and not api_key:
            raise ConfigError(
                f"env.options.host: {host!r} is not a loopback address; serving agents "
                "beyond this machine needs env.options.api_key"
            )
        if max_request_bytes < 1024:
            raise ConfigError(
                f"env.options.max_request_bytes must be >= 1024, got {max_request_bytes}"
            )
        self.model, self.host, self.port = model, host, port
        self.api_key, self.max_request_bytes = api_key, max_request_bytes
        self._episodes: dict[str, AgentEpisode] = {}
        self._keys: dict[int, str] = {}
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self.calls = 0
        self.refused = 0

    # -- lifetime ------------------------------------------------------------------
    async def start(self) -> None:
        import uvicorn

        class Quiet(uvicorn.Server):
            """Leaves signals to the run: its Ctrl-C handling saves a checkpoint first."""

            @contextlib.contextmanager
            def capture_signals(self):
                yield

            def install_signal_handlers(self) -> None:  # uvicorn < 0.29's name for it
                pass

        config = uvicorn.Config(
            self.app(), host=self.host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = Quiet(config)
        self._task = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            if self._task.done():  # it failed to bind: say why
                self._task.result()
                raise ConfigError(f"the agent endpoint did not start on {self.host}:{self.port}")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        log.info("agent endpoint on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- episodes ------------------------------------------------------------------
    def open(self, episode: AgentEpisode) -> ClientConfig:
        key = secrets.token_urlsafe(16)
        self._episodes[key] = episode
        self._keys[id(episode)] = key
        return ClientConfig(f"{self.url}/episodes/{key}/v1", self.api_key or NO_KEY, self.model)

    def close(self, episode: AgentEpisode) -> None:
        key = self._keys.pop(id(episode), None)
        if key is not None:
            self._episodes.pop(key, None)

    # -- HTTP ------------------------------------------------------------------------
    def app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
        app.post("/episodes/{key}/v1/reward")(self._reward)
        app.get("/episodes/{key}/v1/models")(self._models)
        app.post("/episodes/{key}/v1/chat/completions")(self._chat)
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        app.api_route("/{path:path}", methods=methods)(self._unknown)
        return app

    def _refuse(self, exc: ApiError) -> JSONResponse:
        self.refused += 1
        return JSONResponse(exc.body(), status_code=exc.status)

    async def _reward(self, key: str, request: Request):
        """An agent posts its episode's reward (checked when the episode ends)."""
        try:
            episode = self._episode(key, request)
            body = await self._read(request)
            try:
                posted = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError):
                posted = None
            if not isinstance(posted, dict) or "reward" not in posted:
                raise ApiError(
                    400, 'post {"reward": number, "success": bool} as JSON', param="reward"
                )
            episode.posted = posted
        except ApiError as exc:
            return self._refuse(exc)
        return {"ok": True}

    async def _models(self, key: str, request: Request):
        try:
            self._episode(key, request)
        except ApiError as exc:
            return self._refuse(exc)
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "pearl"}
        return {"object": "list", "data": [card]}

    async def _chat(self, key: str, request: Request):
        """A chat completion: the episode's next turn, as one body or streamed."""
        try:
            episode = self._episode(key, request)
            body = await self._read(request)
            chat_request = ChatRequest.parse(body)
            if chat_request.model != self.model:
                raise ApiError(
                    404,
                    f"model {chat_request.model!r} does not exist; this endpoint serves "
                    f"{self.model!r}",
                    param="model",
                    code="model_not_found",
                )
            self.calls += 1
            reply, prompt = await episode.complete(chat_request)
        except ApiError as exc:
            return self._refuse(exc)
        except Exception as exc:  # the run's side failed (no worker, a stopped run)
            log.exception("agent call failed")
            return self._refuse(ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error"))
        out = completion_body(
            reply,
            self.model,
            prompt,
            episode.chat,
            chat_request.logprobs,
            chat_request.return_token_ids,
        )
        if chat_request.stream:
            chunks = stream_chunks(out)

            async def events():
                for chunk in chunks:
                    yield chunk

            return StreamingResponse(events(), media_type="text/event-stream")
        return out

    async def _unknown(self, path: str):
        return self._refuse(
            ApiError(
                404,
                f"no route /{path}: agents call POST <base_url>/chat/completions, with "
                "base_url http://HOST:PORT/episodes/<key>/v1 as their episode was given",
                code="unknown_url",
            )
        )

    def _episode(self, key: str, request: Request) -> AgentEpisode:
        if self.api_key is not None:
            given = request.headers.get("authorization", "")
            expected = f"Bearer {self.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                raise ApiError(
                    401,
                    "invalid or missing API key (Authorization: Bearer <key>)",
                    kind="authentication_error",
                    code="invalid_api_key",
                )
        episode = self._episodes.get(key)
        if episode is None:
            raise ApiError(
                404,
                "no open episode has this base URL (it ended, or the URL is wrong)",
                code="episode_not_found",
            )
        return episode

    async def _read(self, request: Request) -> bytes:
        """The body, refused (413) past ``max_request_bytes`` without reading it whole."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"the request body is over this endpoint's limit of {limit} bytes", code="too_large"
    )
