"""CPU limits as a kubelet enforces them on cgroup v1: a cgroup per container with CPU
resources, cpu.cfs_quota_us from `limits.cpu` and cpu.shares from `requests.cpu`."""

from __future__ import annotations

import contextlib
import decimal
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .api import Obj

if TYPE_CHECKING:
    from .network import Layout

# cgroup v1's cpu controller, where the host mounts it; a kubelet's CFS period, and the kernel's
# smallest quota (a kubelet's floor too).
CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000

log = logging.getLogger("nodeagent")


def millicores(quantity: str | int | float | None) -> int | None:
    """A CPU quantity ("500m", "2", "0.25") in millicores, rounded up as Kubernetes does; None if unset."""
    if quantity is None:
        return None
    text = str(quantity)
    try:
        value = decimal.Decimal(text[:-1]) / 1000 if text.endswith("m") else decimal.Decimal(text)
    except decimal.InvalidOperation:
        log.warning("CPU quantity %r not understood; not enforced", text)
        return None
    return int((value * 1000).to_integral_value(rounding=decimal.ROUND_CEILING))


def cfs_settings(resources: Obj) -> dict[str, int]:
    """The cgroup v1 cpu files a kubelet writes for a container's resources (none without CPU)."""
    limit = millicores(resources.get("limits", {}).get("cpu"))
    # A limit without a request: the API server defaults the request to the limit.
    request = millicores(resources.get("requests", {}).get("cpu")) or limit
    settings = {}
    if limit:
        settings["cpu.cfs_period_us"] = CFS_PERIOD_US
        settings["cpu.cfs_quota_us"] = max(MIN_CFS_QUOTA_US, limit * CFS_PERIOD_US // 1000)
    if request:
        settings["cpu.shares"] = max(2, request * 1024 // 1000)
    return settings


def remove_cgroups(directory: Path) -> None:
    """Removes a cgroup directory and the ones under it, deepest first (a cgroup with
    processes in it stays: they are killed before this runs)."""
    if not directory.is_dir():
        return
    for parent, _, _ in sorted(os.walk(directory), key=lambda walked: -len(Path(walked[0]).parts)):
        with contextlib.suppress(OSError):
            os.rmdir(parent)


class CpuLimits:
    """One cgroup per container with CPU resources, under the node's own cgroup."""

    def __init__(self, layout: Layout) -> None:
        self.root = layout.cpu_cgroup
        self.enforced = False

    def setup(self) -> None:
        try:
            self.root.mkdir(exist_ok=True)
            (self.root / "cpu.cfs_quota_us").read_text()
        except OSError as e:
            log.warning("CPU limits are not enforced: no writable cgroup v1 cpu controller at %s (%s)", self.root, e)
            return
        self.enforced = True
        log.info("CPU limits and requests are enforced through %s", self.root)

    def container(self, pod_uid: str, name: str, resources: Obj) -> Path | None:
        """The container's cgroup, set up; None when it has no CPU resources or nothing is enforced."""
        settings = cfs_settings(resources)
        if not self.enforced or not settings:
            return None
        directory = self.root / f"pod{pod_uid}" / name
        directory.mkdir(parents=True, exist_ok=True)
        for file, value in settings.items():
            (directory / file).write_text(str(value))
        return directory

    @staticmethod
    def enter(cgroup: Path, pid: int) -> None:
        """Moves a started process into its cgroup (again: writing a member's pid is a no-op)."""
        try:
            (cgroup / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it has exited already; its exit is seen on the next tick
        except OSError as e:
            log.warning("could not move pid %d into %s: %s", pid, cgroup, e)

    def remove(self, pod_uid: str) -> None:
        remove_cgroups(self.root / f"pod{pod_uid}")
