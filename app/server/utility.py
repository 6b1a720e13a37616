"""llama-server's utility endpoints, for the clients and tools written against it:

- `POST /tokenize` {content, add_special?, parse_special?, with_pieces?} -> {tokens}
- `POST /detokenize` {tokens} -> {content}
- `POST /apply-template` {messages} -> {prompt}: the chat template's text for the messages
- `GET /props`: the model, its context, chat template and slots
- `GET /slots`: the conversations' slots (name, tokens held, busy); `POST /slots/{id}`
  with `?action=save|restore|erase` through Stoke's snapshot store
- `GET /metrics`: Prometheus text (metrics.py)

Each answers in words on bad input, like every other route; all but /health need the key.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from app.engine.chat_template import ChatTemplate, TemplateError
from app.engine.worker import Priority
from app.server import metrics
from app.server.errors import ApiError, invalid
from app.server.requests import RequestCore
from app.server.schema import parse_chat


class UtilityRoutes:
    def __init__(self, core: RequestCore) -> None:
        self.core = core

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/apply-template", self.apply_template)
        app.router.add_get("/props", self.props)
        app.router.add_get("/slots", self.slots)
        app.router.add_post("/slots/{id}", self.slot_action)
        app.router.add_get("/metrics", self.metrics)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self.core.body(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise invalid("content", "`content` must be the text to tokenize.")
        info = await self.core.ready()
        tokens = await self.core.engine.tokenize(content, special=_flag(body, "parse_special"))
        if _flag(body, "add_special") and info.add_bos and info.bos_id is not None:
            tokens = [info.bos_id, *tokens]
        if not _flag(body, "with_pieces"):
            return web.json_response({"tokens": tokens})
        pieces = [await self.core.engine.detokenize([t]) for t in tokens]
        return web.json_response(
            {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces, strict=True)]}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self.core.body(request)
        tokens = body.get("tokens")
        info = await self.core.ready()
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < info.n_vocab for t in tokens
        ):
            raise invalid(
                "tokens", f"`tokens` must be a list of token ids from 0 to {info.n_vocab - 1}."
            )
        return web.json_response({"content": await self.core.engine.detokenize(tokens)})

    async def apply_template(self, request: web.Request) -> web.Response:
        body = await self.core.body(request)
        chat = parse_chat({"model": self.core.model_id, "messages": body.get("messages")})
        info = await self.core.ready()
        template = ChatTemplate(
            info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token
        )
        messages = [{"role": m.role, "content": m.text} for m in chat.messages]
        try:
            prompt = template.render(messages, add_generation_prompt=True)
        except TemplateError as exc:
            raise ApiError(400, f"The model's chat template refused these messages: {exc}") from exc
        return web.json_response({"prompt": prompt})

    async def props(self, request: web.Request) -> web.Response:
        info = await self.core.ready()
        return web.json_response(
            {
                "default_generation_settings": {"n_ctx": info.n_ctx, "model": self.core.model_id},
                "total_slots": len(self.core.slots),
                "model_path": str(self.core.engine.options.model_path),
                "model_alias": self.core.model_id,
                "chat_template": info.chat_template,
                "bos_token": info.bos_token,
                "eos_token": info.eos_token,
                "modalities": {"vision": info.projector is not None, "audio": False},
                "build_info": f"stoke {_version()}",
            }
        )

    async def slots(self, request: web.Request) -> web.Response:
        info = self.core.engine.info
        return web.json_response(
            [
                {
                    "id": i,
                    "name": name,
                    "n_ctx": info.n_ctx if info else 0,
                    "n_tokens": len(self.core.slots.tokens(name)),
                    "is_processing": self.core.slots.busy(name),
                }
                for i, name in enumerate(self.core.slots.names())
            ]
        )

    async def slot_action(self, request: web.Request) -> web.Response:
        """`?action=save` (the slot's KV into Stoke's snapshot store, on disk when answered),
        `restore` (the slot's tokens brought back into the KV, from a snapshot where one
        matches) or `erase` (the slot forgets its tokens, so no request continues them)."""
        names = self.core.slots.names()
        raw = request.match_info["id"]
        if not (raw.isdigit() and int(raw) < len(names)):
            raise invalid("id_slot", f"There is no slot {raw[:20]!r}; GET /slots lists them.")
        index, name = int(raw), names[int(raw)]
        action = request.query.get("action")
        body = await self.core.body(request) if request.can_read_body else {}
        filename = str(body.get("filename") or name)
        tokens = self.core.slots.tokens(name)
        start = time.monotonic()
        if action == "save":
            saved = await self.core.engine.snapshot(name, priority=Priority.USER, wait=True)
            ms = round(1000 * (time.monotonic() - start), 3)
            return web.json_response(
                {
                    "id_slot": index,
                    "filename": filename,
                    "n_saved": saved,
                    "n_written": saved,
                    "timings": {"save_ms": ms},
                }
            )
        if action == "restore":
            if not tokens:
                raise invalid("id_slot", f"Slot {index} holds no conversation to restore.")
            stats = await self.core.engine.prefill(tokens, slot=name, priority=Priority.USER)
            ms = round(1000 * (time.monotonic() - start), 3)
            return web.json_response(
                {
                    "id_slot": index,
                    "filename": filename,
                    "n_restored": stats.reused_tokens,
                    "n_read": stats.restored_tokens,
                    "timings": {"restore_ms": ms},
                }
            )
        if action == "erase":
            self.core.slots.release(name, ())
            return web.json_response({"id_slot": index, "n_erased": len(tokens)})
        raise invalid("action", "`action` must be save, restore or erase.")

    async def metrics(self, request: web.Request) -> web.Response:
        stats = self.core.stats
        prefix = "stoke:"
        blocks = [
            metrics.counter(f"{prefix}requests_total", "Requests received.", stats.requests),
            metrics.counter(f"{prefix}replies_total", "Replies finished.", stats.completed),
            metrics.counter(
                f"{prefix}disconnected_total", "Clients that left mid-reply.", stats.disconnected
            ),
            metrics.counter(
                f"{prefix}rejected_total", "Requests answered with an error.", stats.rejected
            ),
            metrics.counter(
                f"{prefix}requests_processing", "Requests running now.", stats.in_flight, "gauge"
            ),
            metrics.counter(
                f"{prefix}prompt_tokens_total",
                "Prompt tokens of finished replies.",
                stats.prompt_tokens,
            ),
            metrics.counter(
                f"{prefix}prompt_tokens_reused_total",
                "Of those, tokens reused from the cache instead of prefilled.",
                stats.reused_tokens,
            ),
            metrics.counter(
                f"{prefix}prompt_tokens_prefilled_total",
                "Of those, tokens prefilled.",
                stats.prompt_tokens - stats.reused_tokens,
            ),
            metrics.counter(
                f"{prefix}tokens_predicted_total", "Tokens generated.", stats.generated_tokens
            ),
            stats.ttft_s.lines(f"{prefix}ttft_seconds", "Time to the first token."),
            stats.decode_tok_s.lines(
                f"{prefix}decode_tokens_per_second", "Decode rate of each reply."
            ),
            [
                f"# HELP {prefix}model_loaded Whether the model is loaded.",
                f"# TYPE {prefix}model_loaded gauge",
                f'{prefix}model_loaded{{model="{_label(self.core.model_id)}"}} '
                f"{1 if self.core.engine.info is not None else 0}",
            ],
        ]
        return web.Response(text=metrics.text(blocks), content_type="text/plain", charset="utf-8")


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise invalid(name, f"`{name}` must be true or false.")
    return value


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _version() -> str:
    try:
        return importlib.metadata.version("stoke")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
