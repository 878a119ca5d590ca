"""The server image serves tf.data the way the operator's pods run it.

A dispatcher and a worker run as two containers on a user-defined network, the worker
reaching the dispatcher by container name, both as uid/gid 1000 on a read-only root
filesystem with only /tmp writable (a tmpfs, like the pods' emptyDir), no capabilities
and no privilege escalation; the fault-tolerant dispatcher journals to a volume at
/var/lib/tfdata. Their configurations are what ``serverconfig.to_json`` writes, as the
operator's builders do. A real ``tf.data`` client in a third container reads through them.
"""

from __future__ import annotations

import json
import secrets
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tfdata_operator.wire import serverconfig
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures.docker import Docker, DockerError, http_status
from fixtures.support import Gone, wait_for

DISPATCHER_PORT = 5050
WORKER_PORT = 5051
HEALTH_PORT = 8081
JOURNAL_DIR = "/var/lib/tfdata/journal"
# What the operator's pod spec enforces, as `docker run` flags.
RESTRICTED = (
    "--user", "1000:1000", "--read-only", "--tmpfs", "/tmp",
    "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
)  # fmt: skip
# Starting takes one TensorFlow import (a few seconds; more on a busy machine); a worker's
# registration retries back off.
READY_TIMEOUT = 180.0
CLIENT_TIMEOUT = 180.0

# Reads tf.data.Dataset.range(100) through the service; prints the elements on the last line.
CLIENT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    dataset = tf.data.Dataset.range(100).apply(
        tf.data.experimental.service.distribute(processing_mode="parallel_epochs", service=sys.argv[1])
    )
    print("ELEMENTS " + json.dumps([int(x) for x in dataset.as_numpy_iterator()]))
    """
)


@dataclass
class Service:
    docker: Docker
    image: str
    network: str
    volume: str
    dispatcher: str
    worker: str

    @property
    def address(self) -> str:
        return f"grpc://{self.dispatcher}:{DISPATCHER_PORT}"

    def probe(self, container: str, path: str) -> int | None:
        return http_status(f"http://{self.docker.ip(container, self.network)}:{HEALTH_PORT}{path}")

    def logs(self) -> str:
        return "\n".join(self.docker.logs(c) for c in (self.dispatcher, self.worker))

    def wait_ready(self, container: str) -> None:
        def ready() -> bool:
            if not self.docker.running(container):
                raise Gone(f"{container} is not running")
            return self.probe(container, "/readyz") == 200

        wait_for(ready, READY_TIMEOUT, f"{container} to answer 200 on /readyz", show=self.logs)

    def read(self) -> list[int]:
        """Runs the tf.data client in a third container; returns the elements it read."""
        name = self.docker.name(f"client-{secrets.token_hex(2)}")
        try:
            result = self.docker.run(
                "run", "--rm", "--name", name, *self.docker.label, "--network", self.network, *RESTRICTED,
                "--entrypoint", "python", self.image, "-c", CLIENT, self.address,
                timeout=CLIENT_TIMEOUT, check=False,
            )  # fmt: skip
        except DockerError as exc:
            raise AssertionError(f"the tf.data client did not finish: {exc}\n{self.logs()}") from exc
        lines = [line for line in result.stdout.splitlines() if line.startswith("ELEMENTS ")]
        assert result.returncode == 0 and lines, (
            f"the tf.data client exited with {result.returncode}\nstdout: {result.stdout}\n"
            f"stderr: {result.stderr[-3000:]}\n{self.logs()}"
        )
        return [int(x) for x in json.loads(lines[-1].removeprefix("ELEMENTS "))]


@pytest.fixture(scope="module")
def service(docker: Docker, server_image: str) -> Iterator[Service]:
    network = docker.name("net")
    volume = docker.name("journal")
    docker.run("network", "create", *docker.label, network)
    docker.run("volume", "create", *docker.label, volume)
    dispatcher, worker = docker.name("dispatcher"), docker.name("worker")
    dispatcher_config = DispatcherServerConfig(
        port=DISPATCHER_PORT, health_port=HEALTH_PORT, fault_tolerant_mode=True, work_dir=JOURNAL_DIR
    )
    worker_config = WorkerServerConfig(
        port=WORKER_PORT,
        health_port=HEALTH_PORT,
        dispatcher_address=f"{dispatcher}:{DISPATCHER_PORT}",
        # Resolves on the network as the pod's DNS name does in a cluster.
        worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{WORKER_PORT}",
    )
    docker.run(
        "run", "-d", "--name", dispatcher, *docker.label, "--network", network, *RESTRICTED,
        "--volume", f"{volume}:/var/lib/tfdata",
        "--env", f"{serverconfig.CONFIG_ENV}={serverconfig.to_json(dispatcher_config)}",
        server_image, "dispatcher",
    )  # fmt: skip
    docker.run(
        "run", "-d", "--name", worker, *docker.label, "--network", network, *RESTRICTED,
        "--env", f"{serverconfig.CONFIG_ENV}={serverconfig.to_json(worker_config)}",
        "--env", f"{serverconfig.POD_NAME_ENV}={worker}",
        server_image, "worker",
    )  # fmt: skip
    yield Service(docker, server_image, network, volume, dispatcher, worker)
    # The session removes the containers, the network and the volume.


def test_image_runs_as_uid_1000_with_tfdata_server_as_entrypoint(docker: Docker, server_image: str) -> None:
    config = docker.inspect(server_image, kind="image")["Config"]
    assert config["User"].split(":")[0] == "1000", config["User"]
    assert config["Entrypoint"] == ["tfdata-server"]
    whoami = docker.run("run", "--rm", "--entrypoint", "id", server_image).stdout
    assert whoami.startswith("uid=1000(tfdata) gid=1000(tfdata)"), whoami


def test_dispatcher_and_worker_become_ready(service: Service) -> None:
    service.wait_ready(service.dispatcher)
    service.wait_ready(service.worker)
    for container in (service.dispatcher, service.worker):
        assert service.probe(container, "/healthz") == 200, service.logs()


def test_a_tf_data_client_reads_every_element(service: Service) -> None:
    service.wait_ready(service.dispatcher)
    service.wait_ready(service.worker)
    elements = service.read()
    # parallel_epochs: each worker produces the whole dataset, and there is one worker.
    assert sorted(elements) == list(range(100)), elements


def test_dispatcher_journals_to_the_volume_as_uid_1000(service: Service) -> None:
    service.wait_ready(service.dispatcher)
    service.wait_ready(service.worker)  # its registration is journaled

    def journal() -> str:
        find = ["find", JOURNAL_DIR, "-type", "f", "-size", "+0c", "-printf", "%U %s %p\\n"]
        return service.docker.run("exec", service.dispatcher, *find, check=False).stdout.strip()

    listing = wait_for(journal, 30, f"a non-empty journal file under {JOURNAL_DIR}", show=service.logs)
    owners = {line.split()[0] for line in listing.splitlines()}
    assert owners == {"1000"}, listing


def test_dispatcher_recovers_from_its_journal_after_a_restart(service: Service) -> None:
    service.wait_ready(service.dispatcher)
    service.wait_ready(service.worker)
    service.docker.run("restart", "--time", "20", service.dispatcher, timeout=60)
    service.wait_ready(service.dispatcher)
    # TensorFlow's own words: the first start found no journal, the restart replayed it.
    log = service.docker.run("logs", service.dispatcher).stderr
    assert "Restored from journal" in log, service.logs()
    elements = service.read()
    assert sorted(elements) == list(range(100)), elements
