"""The API server beside the window (Settings > API Server): started and stopped on the
window's own engine client and event loop. No Qt here; the dialog calls these."""

from __future__ import annotations

from dataclasses import replace

from app.engine.host import EngineClient
from app.engine.protocol import EngineError
from app.server import auth
from app.server.app import ApiServer, ServerConfig


class LocalServer:
    """At most one running ApiServer over `engine`, with the stored key."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self.server: ApiServer | None = None
        self.key: auth.ApiKey | None = None

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
        server = ApiServer(self.engine, ServerConfig(api_key=self.api_key().value, port=port))
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
