"""The node's client of the API server: raw JSON over the official client's connection
handling, and the time format the API writes."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


def timestamp() -> str:
    """Now, as the API writes times in statuses."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class Api:
    """Raw JSON over the official client's connection handling (auth, TLS from the kubeconfig)."""

    def __init__(self, kubeconfig: Path) -> None:
        import kubernetes  # here, not at the top: `cleanup` and `client` must not need it

        self.client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))

    def call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json", timeout: float = 30, stream: bool = False,
    ) -> Any:  # fmt: skip
        method, url, headers, payload, _ = self.client.param_serialize(
            method, path, query_params=query or [], body=body, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json", "Content-Type": content_type},
        )  # fmt: skip
        response = self.client.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout)
        if stream and response.status == 200:
            return response.response  # urllib3's response: iterate it for watch events
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiError(response.status, data.decode(errors="replace"))
        return json.loads(data) if data else {}

    def get(self, path: str) -> Obj | None:
        try:
            result: Obj = self.call("GET", path)
            return result
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, body: Obj) -> None:
        try:
            self.call("POST", path, body)
        except ApiError as e:
            if e.status != 409:
                raise

    def merge_patch(self, path: str, body: Obj) -> Any:
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")
