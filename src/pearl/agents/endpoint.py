"""The OpenAI-compatible HTTP endpoint agents call during ``pearl train``.

FastAPI on uvicorn, the pair vLLM's and SGLang's OpenAI servers are built on, runs in the
driver's event loop, next to the router: a call is a coroutine that awaits its turn, with
no thread or process hop. Each episode gets its own base URL,
``http://HOST:PORT/episodes/<key>/v1`` (the key is random and unguessable), so an
unmodified agent needs only ``base_url`` set; ``GET .../v1/models`` lists the one model.

Security: it listens on the loopback interface unless ``host`` says otherwise, and then
it needs an ``api_key``, checked on every request (``Authorization: Bearer``). Bodies over
``max_request_bytes`` are refused before they are read whole, JSON nested deeper than
``MAX_JSON_DEPTH`` at the door; every answer that is not a success, on every route and
method, is an OpenAI error object, and a failure on the run's side is logged with a
reference the body gives, never its exception text; nothing an agent sends is evaluated
(JSON is parsed, templates run sandboxed).

``stop()`` takes at most ``STOP_GRACE_S`` (plus a moment): calls still in flight then are
cancelled, so a call waiting for workers that are gone cannot hold the run's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import secrets
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from pearl.agents.episode import ClientConfig, episode_not_found, finite_number
from pearl.agents.loop_watch import LoopWatch
from pearl.agents.messages import ApiError, ChatRequest, load_json
from pearl.agents.replies import completion_body, stream_chunks
from pearl.errors import ConfigError

if TYPE_CHECKING:
    from pearl.agents.episode import AgentEpisode

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
NO_KEY = "none"  # what agents pass as api_key when the endpoint checks none (SDKs need one)
STOP_GRACE_S = 2  # how long stop() lets calls in flight finish before cancelling them
# The routes, for telling a wrong method (405) from a wrong URL (404).
ROUTES = {"reward": "POST", "models": "GET", "chat/completions": "POST"}


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
        self.watch = LoopWatch()
        self.received = 0  # requests that reached an open episode
        self.calls = 0  # chat completions read whole and passed to their episode
        self.refused = 0

    # -- lifetime ------------------------------------------------------------------
    async def start(self) -> None:
        import uvicorn  # live extra

        class Quiet(uvicorn.Server):
            """Leaves signals to the run: its Ctrl-C handling saves a checkpoint first."""

            @contextlib.contextmanager
            def capture_signals(self):
                yield

            def install_signal_handlers(self) -> None:  # uvicorn < 0.29's name for it
                pass

        config = uvicorn.Config(
            self.app(),
            host=self.host,
            port=self.port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=STOP_GRACE_S,
        )
        self._server = Quiet(config)
        self._task = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            if self._task.done():  # it failed to bind: say why
                self._task.result()
                raise ConfigError(f"the agent endpoint did not start on {self.host}:{self.port}")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        self.watch.start()
        log.info("agent endpoint on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop serving: calls in flight get ``STOP_GRACE_S`` to finish, then are cancelled."""
        self.watch.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            # uvicorn cancels the calls after its grace; then it waits for their clients to
            # hang up, which a careless client need never do: bounded here.
            await asyncio.wait({self._task}, timeout=STOP_GRACE_S + 2.0)
            if not self._task.done():
                self._server.force_exit = True
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- episodes ------------------------------------------------------------------
    def open(self, episode: AgentEpisode) -> ClientConfig:
        key = secrets.token_urlsafe(16)
        self.watch.add(episode.agent)
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
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
        app.api_route("/{path:path}", methods=methods)(self._unknown)
        app.exception_handler(HTTPException)(self._http_error)
        app.exception_handler(Exception)(self._internal_error)
        return app

    def _refuse(self, exc: ApiError) -> JSONResponse:
        self.refused += 1
        return JSONResponse(exc.body(), status_code=exc.status)

    async def _reward(self, key: str, request: Request):
        """An agent posts its episode's reward (checked when the episode ends)."""
        try:
            episode = self._episode(key, request)
            posted = _posted_reward(await self._read(request))
            if not episode.takes_calls:  # it ended while the body was read: too late
                raise episode_not_found()
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
            return await self._internal_error(request, exc)
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

    async def _unknown(self, path: str, request: Request):
        route = path.split("/v1/", 1)[-1] if path.startswith("episodes/") else None
        if route in ROUTES:
            return self._refuse(
                ApiError(
                    405,
                    f"{request.method} is not allowed on /{path}; use {ROUTES[route]}",
                    code="method_not_allowed",
                )
            )
        return self._refuse(
            ApiError(
                404,
                f"no route /{path}: agents call POST <base_url>/chat/completions, with "
                "base_url http://HOST:PORT/episodes/<key>/v1 as their episode was given",
                code="unknown_url",
            )
        )

    async def _http_error(self, request: Request, exc: Exception) -> JSONResponse:
        """An error the framework raised (a malformed request line, say), as OpenAI's."""
        status = getattr(exc, "status_code", 400)
        return self._refuse(ApiError(status, str(getattr(exc, "detail", "") or "bad request")))

    async def _internal_error(self, request: Request, exc: Exception) -> JSONResponse:
        """A failure on the run's side (no worker, a stopped run, a bug): logged in full with
        a reference; the agent gets the reference, not the exception's text."""
        ref = secrets.token_hex(4)
        log.error(
            "agent call %s %s failed (ref %s)", request.method, request.url.path, ref, exc_info=exc
        )
        return self._refuse(
            ApiError(
                500,
                f"the server failed to answer this call (ref {ref}; the run's log has why)",
                kind="server_error",
                code="internal_error",
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
            raise episode_not_found()
        self.received += 1
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


def _posted_reward(body: bytes) -> dict[str, Any]:
    """A ``/reward`` body checked at the door: ``{"reward": finite number, "success": bool}``
    (``success`` optional)."""
    usage = 'post {"reward": number, "success": bool} as JSON'
    try:
        posted = load_json(body)
    except ValueError as exc:
        raise ApiError(400, f"the body is {exc}; {usage}") from None
    if not isinstance(posted, dict) or "reward" not in posted:
        raise ApiError(400, usage, param="reward")
    unknown = sorted(set(posted) - {"reward", "success"})
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}; {usage}", param=unknown[0])
    reward = posted["reward"]
    if finite_number(reward) is None:
        raise ApiError(400, "reward must be a finite number", param="reward")
    if not isinstance(posted.get("success", False), bool):
        raise ApiError(400, "success must be true or false", param="success")
    return posted


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"the request body is over this endpoint's limit of {limit} bytes", code="too_large"
    )
