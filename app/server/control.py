"""The API server beside the window (Settings > API Server): started and stopped on the
window's own engine client and event loop, with the window's reply sink while the setting
"Keep API conversations in the window" is on. No Qt here; the dialog calls these."""

from __future__ import annotations

from dataclasses import replace

from app.engine.host import EngineClient
from app.engine.protocol import EngineError
from app.server import auth
from app.server.app import ApiServer
from app.server.requests import ServerConfig
from app.server.served import ReplySink
from app.settings import Settings


class LocalServer:
    """At most one running ApiServer over `engine`, with the stored key; its finished chat
    replies go to `sink` while `keeping`."""

    def __init__(self, engine: EngineClient, sink: ReplySink | None = None) -> None:
        self.engine = engine
        self.sink = sink
        self.server: ApiServer | None = None
        self.key: auth.ApiKey | None = None

    @property
    def keeping(self) -> bool:
        """Whether served conversations are kept (the setting, and a sink to keep them)."""
        return self.sink is not None and Settings.load().keep_api_conversations

    def set_keeping(self, on: bool) -> None:
        """Keep served conversations from now on (or stop), also on the running server."""
        settings = Settings.load()
        settings.keep_api_conversations = on
        settings.save()
        if self.server is not None:
            self.server.sink = self.sink if on else None

    @property
    def running(self) -> bool:
        return self.server is not None

    def api_key(self) -> auth.ApiKey:
        """The key clients must send (made and stored on first use)."""
        if self.key is None:
            self.key = auth.resolve()
        return self.key

    async def start(self, port: int) -> str:
        """Serve on 127.0.0.1:`port`; returns the base URL. A taken port is an EngineError
        whose words say what to do."""
        if self.server is not None:
            return self.server.url
        config = ServerConfig(api_key=self.api_key().value, port=port)
        server = ApiServer(self.engine, config, self.sink if self.keeping else None)
        try:
            url = await server.start()
        except OSError as exc:
            raise EngineError(
                f"The API server cannot listen on port {port} ({exc.strerror or exc}); "
                "choose another port."
            ) from exc
        self.server = server
        return url

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.stop()

    def renew_key(self) -> auth.ApiKey:
        """A new key; the old one stops working at once, also on the running server."""
        self.key = auth.renew()
        if self.server is not None:
            self.server.config = replace(self.server.config, api_key=self.key.value)
        return self.key
