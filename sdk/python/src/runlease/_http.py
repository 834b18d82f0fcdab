"""JSON over HTTP to one coordinator, blocking and asyncio, over httpx."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

import httpx

from .errors import Unreachable, api_error

#: Seconds a request may take when the caller names no timeout.
DEFAULT_TIMEOUT = 30.0

__version__ = "0.1.0"


def _headers(key: Optional[str], extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
    headers = {"content-type": "application/json", "user-agent": f"runlease-python/{__version__}"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if extra:
        headers.update(extra)
    return headers


def _answer(response: httpx.Response) -> Any:
    if response.status_code // 100 != 2:
        raise api_error(response.status_code, response.content, response.headers.get("retry-after"))
    if not response.content:
        return None
    return json.loads(response.content)


class SyncApi:
    """Blocking calls; safe to share between threads (httpx.Client is)."""

    def __init__(self, url: str, key: Optional[str], client: Optional[httpx.Client] = None) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self._owned = client is None
        self.client = client if client is not None else httpx.Client(timeout=DEFAULT_TIMEOUT)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        params: Optional[Mapping[str, str]] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Any:
        """Sends one request; answers the parsed JSON or raises `ApiError`/`Unreachable`."""
        content = None if body is None else json.dumps(body).encode()
        try:
            response = self.client.request(
                method,
                self.url + path,
                content=content,
                params=params,
                headers=_headers(self.key, headers),
                timeout=timeout,
            )
        except httpx.TransportError as e:
            raise Unreachable(f"{method} {path}: {type(e).__name__}: {e}") from e
        return _answer(response)

    def close(self) -> None:
        """Closes the HTTP client if this object made it."""
        if self._owned:
            self.client.close()


class AsyncApi:
    """asyncio calls over one httpx.AsyncClient."""

    def __init__(self, url: str, key: Optional[str], client: Optional[httpx.AsyncClient] = None) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self._owned = client is None
        self.client = client if client is not None else httpx.AsyncClient(timeout=DEFAULT_TIMEOUT)

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        params: Optional[Mapping[str, str]] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Any:
        """Sends one request; answers the parsed JSON or raises `ApiError`/`Unreachable`."""
        content = None if body is None else json.dumps(body).encode()
        try:
            response = await self.client.request(
                method,
                self.url + path,
                content=content,
                params=params,
                headers=_headers(self.key, headers),
                timeout=timeout,
            )
        except httpx.TransportError as e:
            raise Unreachable(f"{method} {path}: {type(e).__name__}: {e}") from e
        return _answer(response)

    async def close(self) -> None:
        """Closes the HTTP client if this object made it."""
        if self._owned:
            await self.client.aclose()
