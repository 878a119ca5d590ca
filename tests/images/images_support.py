"""The real Docker CLI for the image tests: every call has a timeout, every failure shows stderr.

Everything a test creates (containers, networks, volumes) carries the label
``tfdata-images-test=<pid of the pytest session>``, so the session removes its own at the
end and the leftovers of sessions that died (SIGKILL, a crash) at the start.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

LABEL = "tfdata-images-test"


class DockerError(AssertionError):
    pass


@dataclass
class Docker:
    """One docker CLI (the one images/docker-daemon.sh chose) and what this session created."""

    binary: str
    env: dict[str, str]
    session: str
    prefix: str = field(default_factory=lambda: f"tfd-{secrets.token_hex(3)}")

    def run(
        self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            result = subprocess.run(
                [self.binary, *args], env=self.env, capture_output=True, text=True, timeout=timeout, input=input
            )
        except subprocess.TimeoutExpired as exc:
            raise DockerError(
                f"docker {' '.join(args)} did not finish within {timeout:.0f}s\n"
                f"stdout: {_text(exc.stdout)}\nstderr: {_text(exc.stderr)}"
            ) from exc
        if check and result.returncode != 0:
            raise DockerError(
                f"docker {' '.join(args)} exited with {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def name(self, what: str) -> str:
        """A name no other session (or engineer) uses at the same time."""
        return f"{self.prefix}-{what}"

    @property
    def label(self) -> list[str]:
        return ["--label", f"{LABEL}={self.session}"]

    def inspect(self, *names: str, kind: str = "container") -> Any:
        found = json.loads(self.run(kind, "inspect", *names).stdout)
        return found[0] if len(names) == 1 else found

    def logs(self, container: str, tail: int = 60) -> str:
        result = self.run("logs", "--tail", str(tail), container, check=False)
        return f"--- docker logs {container} (last {tail} lines) ---\n{result.stdout}{result.stderr}"

    def running(self, container: str) -> bool:
        result = self.run("inspect", "--format", "{{.State.Running}}", container, check=False)
        return result.stdout.strip() == "true"

    def ip(self, container: str, network: str) -> str:
        networks = self.inspect(container)["NetworkSettings"]["Networks"]
        return str(networks[network]["IPAddress"])

    def remove_session(self, session: str) -> None:
        """Removes what the session `session` created: containers first, then networks and volumes."""
        selector = f"label={LABEL}={session}"
        containers = self.run("ps", "-aq", "--filter", selector).stdout.split()
        if containers:
            self.run("rm", "-f", "-v", *containers, timeout=120)
        networks = self.run("network", "ls", "-q", "--filter", selector).stdout.split()
        if networks:
            self.run("network", "rm", *networks)
        volumes = self.run("volume", "ls", "-q", "--filter", selector).stdout.split()
        if volumes:
            self.run("volume", "rm", *volumes)

    def sessions(self) -> set[str]:
        """Sessions with something left behind."""
        found: set[str] = set()
        for kind in ("ps -a", "network ls", "volume ls"):
            listing = self.run(*kind.split(), "--filter", f"label={LABEL}", "--format", f'{{{{.Label "{LABEL}"}}}}')
            found.update(listing.stdout.split())
        return found


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def http_status(url: str, timeout: float = 2) -> int | None:
    """The HTTP status of a GET, or None when nothing answers; proxies from the environment are bypassed."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def parse_env_lines(text: str) -> dict[str, str]:
    """`export NAME=value` lines (as images/docker-daemon.sh prints them) as a dict."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            found[name] = value
    return found


def read_version(pyproject: Path) -> str:
    """The package version, read the way images/images.sh reads it to tag the images."""
    found = re.search(r'^version = "([^"]+)"$', pyproject.read_text(), re.MULTILINE)
    assert found, f"no version in {pyproject}"
    return found.group(1)
