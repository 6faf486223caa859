"""A local Kafka (KRaft, combined broker and controller nodes) started from Maven Central jars.

`LocalKafka` is one node: by itself a single-node cluster (the tests' and `make demo`'s broker),
or a member of a `LocalKafkaCluster` of several nodes on loopback, each its own JVM with a small
heap, all of them voters of one static controller quorum (`controller.quorum.voters`): a
three-node cluster keeps a quorum and every partition's ISR (min.insync.replicas=2) with one node
down. `BrokerSecurity` gives a node a SASL_SSL client listener (SCRAM, a PKCS12 keystore) with
the SCRAM users created when its storage is formatted.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from infra.errors import KafkaSetupError

__all__ = [
    "KAFKA_VERSION",
    "BrokerSecurity",
    "LocalKafka",
    "LocalKafkaCluster",
    "down",
    "ensure_jars",
    "kafka_version",
    "running_bootstrap",
    "status",
    "up",
]

Progress = Callable[[str], None]

_POM = Path(__file__).with_name("pom.xml")
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
_HOST = "127.0.0.1"
_STATE_FILE = "kafka.json"
_PROGRESS_EVERY_S = 5.0
# C1 only and a small G1 heap: on a 2-core machine shared with tests, C2 compilation competes for CPU
# and buys nothing for a broker that lives a few minutes.
_HEAP_MB = 512
_CLUSTER_HEAP_MB = 384  # per node of a cluster: three JVMs share the machine with the tests
_LAYOUT_FILE = "layout.json"
_JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <RollingFile name="server" fileName="{log_dir}/server.log" filePattern="{log_dir}/server.log.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <SizeBasedTriggeringPolicy size="50 MB"/>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka" level="INFO"/>
    <Logger name="org.apache.kafka" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="kafka.authorizer.logger" level="WARN"/>
    <Root level="WARN"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
"""


def kafka_version(pom: Path = _POM) -> str:
    """The Kafka version the pom resolves (its `kafka.version` property)."""
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise KafkaSetupError(f"{pom} has no kafka.version property")
    return (node.text or "").strip()


KAFKA_VERSION = kafka_version()


def _default_cache_dir() -> Path:
    env = os.environ.get("RANKSIGHT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ranksight"


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise KafkaSetupError(
            f"`{tool}` not found on PATH: {hint}, or set KAFKA_BOOTSTRAP to use an existing broker"
        )
    return path


def _require_java() -> str:
    return _require("java", "install a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two test sessions starting at once must not run mvn into the same folder.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_jars(cache_dir: Path | None = None, *, progress: Progress = print) -> Path:
    """The folder of Kafka's runtime jars, copied from Maven Central by the pom on first use."""
    version_dir = (cache_dir or _default_cache_dir()) / f"kafka-{KAFKA_VERSION}"
    libs = version_dir / "libs"
    marker = version_dir / "complete"
    # The marker holds the pom's hash, so editing the pom (a new logging binding, say) re-resolves.
    pom_hash = hashlib.sha256(_POM.read_bytes()).hexdigest()
    if marker.is_file() and marker.read_text().strip() == pom_hash and any(libs.glob("*.jar")):
        return libs
    with _locked(version_dir / ".lock"):
        if marker.is_file() and marker.read_text().strip() == pom_hash and any(libs.glob("*.jar")):
            return libs
        _require_java()
        mvn = _require("mvn", "install Maven (e.g. `apt-get install maven`)")
        marker.unlink(missing_ok=True)
        shutil.rmtree(libs, ignore_errors=True)
        progress(f"fetching Kafka {KAFKA_VERSION} jars from Maven Central into {libs} (once)")
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(_POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(libs.glob("*.jar")):
            tail = _tail_text((result.stdout + result.stderr).splitlines())
            raise KafkaSetupError(
                f"Maven could not fetch the Kafka jars (exit {result.returncode}); check access to Maven Central",
                log_tail=tail,
            )
        marker.write_text(pom_hash + "\n")
    return libs


def _tail_text(lines: list[str], count: int = 30) -> str:
    return "\n".join(lines[-count:])


def _tail_file(path: Path, count: int = 30) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            return _tail_text(handle.read().decode(errors="replace").splitlines(), count)
    except OSError:
        return ""


def _cluster_id() -> str:
    """A cluster id as `StorageTool random-uuid` makes one, without a second JVM start (~1 s)."""
    while True:
        # Kafka's Uuid.toString(): URL-safe base64 of 16 random bytes, no padding, never starting with "-".
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _free_ports(count: int) -> list[int]:
    # Keep every socket open until all are bound, so the ports differ from one another.
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((_HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _sees_brokers(conf: dict[str, Any], brokers: int, timeout: float) -> bool:
    """Whether the cluster behind `conf` answers metadata listing at least `brokers` brokers."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # log_level 0 keeps librdkafka's connection-refused chatter off our stderr while we poll.
    admin = AdminClient({**conf, "log_level": 0, "reconnect.backoff.max.ms": 500})
    try:
        return len(admin.list_topics(timeout=timeout).brokers) >= brokers
    except KafkaException:
        return False


@dataclass(frozen=True)
class BrokerSecurity:
    """A SASL_SSL client listener: the broker's PKCS12 keystore and the SCRAM users it knows.

    Inter-broker and controller traffic stay on PLAINTEXT listeners bound to 127.0.0.1 that no
    client is told about (this is a local broker for tests and development, not a hardened one).
    """

    keystore: Path
    keystore_password: str = field(repr=False)
    users: Mapping[str, str] = field(default_factory=dict, repr=False)  # name -> password
    ca_location: Path | None = None  # the CA that signed the keystore's certificate (readiness checks)
    mechanism: str = "SCRAM-SHA-512"
    # KRaft's StandardAuthorizer with these SCRAM users as super users (the operators who apply the
    # ACLs of `infra.kafka.acls`); everyone else may do only what an ACL allows. Off: no authorizer.
    super_users: tuple[str, ...] = ()

    def scram_arguments(self) -> list[str]:
        """`kafka-storage format --add-scram` arguments creating every user."""
        out: list[str] = []
        for name, password in sorted(self.users.items()):
            out += ["--add-scram", f"{self.mechanism}=[name={name},password={password}]"]
        return out


@dataclass(frozen=True)
class _Layout:
    """Where one node listens and which quorum it belongs to; kept in `layout.json` across restarts."""

    node_id: int
    port: int
    controller_port: int
    internal_port: int | None = None  # inter-broker PLAINTEXT listener when clients use SASL_SSL
    voters: tuple[tuple[int, int], ...] | None = None  # (node id, controller port); None: standalone
    cluster_id: str | None = None
    replication: int = 1

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "voters": [list(v) for v in self.voters] if self.voters else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Layout:
        voters = tuple((int(a), int(b)) for a, b in data["voters"]) if data.get("voters") else None
        return cls(**{**data, "voters": voters})


def _server_properties(layout: _Layout, *, log_dir: Path, security: BrokerSecurity | None = None) -> str:
    port, controller_port = layout.port, layout.controller_port
    replication = layout.replication
    # One node down must leave every partition writable with acks=all: ISR of 2 out of 3.
    min_isr = 1 if replication < 3 else 2
    if security is None:
        listeners = f"PLAINTEXT://{_HOST}:{port},CONTROLLER://{_HOST}:{controller_port}"
        advertised = f"PLAINTEXT://{_HOST}:{port}"
        inter_broker = "PLAINTEXT"
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    else:
        listeners = (
            f"SASL_SSL://{_HOST}:{port},INTERNAL://{_HOST}:{layout.internal_port},"
            f"CONTROLLER://{_HOST}:{controller_port}"
        )
        advertised = f"SASL_SSL://{_HOST}:{port},INTERNAL://{_HOST}:{layout.internal_port}"
        inter_broker = "INTERNAL"
        protocols = "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(layout.node_id),
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": inter_broker,
        "listener.security.protocol.map": protocols,
    }
    if layout.voters is None:
        settings["controller.quorum.bootstrap.servers"] = f"{_HOST}:{controller_port}"
    else:
        settings["controller.quorum.voters"] = ",".join(f"{n}@{_HOST}:{p}" for n, p in layout.voters)
    settings |= {
        "log.dirs": str(log_dir),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "4",
        "num.partitions": "3",
        "default.replication.factor": str(replication),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replication),
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": str(replication),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": str(replication),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
    }
    if replication > 1:
        # A restarted node catches up and rejoins the ISR quickly; leaders move back to it.
        settings |= {"replica.lag.time.max.ms": "10000", "leader.imbalance.check.interval.seconds": "30"}
    if security is not None:
        settings |= {
            "sasl.enabled.mechanisms": security.mechanism,
            f"listener.name.sasl_ssl.{security.mechanism.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(security.keystore),
            "ssl.keystore.password": security.keystore_password,
            "ssl.key.password": security.keystore_password,
        }
        if security.super_users:
            # The PLAINTEXT inter-broker and controller listeners (127.0.0.1 only) are ANONYMOUS.
            supers = ["User:ANONYMOUS", *(f"User:{name}" for name in security.super_users)]
            settings |= {
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": ";".join(supers),
                "allow.everyone.if.no.acl.found": "false",
            }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _read_properties(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


def _is_broker(pid: int, config: Path) -> bool:
    import psutil

    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and str(config) in process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _reap(pid: int) -> None:
    # A broker started by this very process stays a zombie (and looks alive) until waited for.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _terminate(pid: int, config: Path, timeout: float) -> None:
    """SIGTERM the broker, wait up to `timeout` for its controlled shutdown, then SIGKILL it."""
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if not _is_broker(pid, config):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(pid)
            if not _is_broker(pid, config):
                return
            time.sleep(0.1)
    raise KafkaSetupError(f"Kafka (pid {pid}) did not exit after SIGKILL")


class LocalKafka:
    """One KRaft broker+controller on 127.0.0.1 whose data, config and ports live in `data_dir`.

    Alone (the default) it is a single-node cluster; `LocalKafkaCluster` makes several of them one
    cluster. With `security`, clients connect with SASL_SSL (see `client_config`)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        libs: Path | None = None,
        progress: Progress = print,
        security: BrokerSecurity | None = None,
        heap_mb: int = _HEAP_MB,
        _layout: _Layout | None = None,
        _expected_brokers: int = 1,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._libs = libs
        self._progress = progress
        self._security = security
        self._heap_mb = heap_mb
        self._expected_brokers = _expected_brokers
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._layout = self._load_layout() or _layout or self._new_layout()

    @property
    def config_path(self) -> Path:
        """The broker's server.properties."""
        return self.data_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        """The broker's own log (log4j2), kept off our stdout."""
        return self.data_dir / "logs" / "server.log"

    @property
    def node_id(self) -> int:
        """The KRaft node id (1 for a single node)."""
        return self._layout.node_id

    @property
    def bootstrap(self) -> str:
        """The address clients connect to, `127.0.0.1:PORT`."""
        return f"{_HOST}:{self._layout.port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the JVM is alive."""
        return self.pid is not None

    def client_config(
        self, *, username: str | None = None, password: str | None = None, ca: Path | None = None
    ) -> dict[str, Any]:
        """librdkafka settings reaching this broker (SASL_SSL ones when it is secured)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        if self._security is not None:
            user, secret = username, password
            if user is None and self._security.users:
                user, secret = sorted(self._security.users.items())[0]
            conf |= {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": self._security.mechanism,
                "sasl.username": user or "",
                "sasl.password": secret or "",
            }
            ca = ca or self._security.ca_location
            if ca is not None:
                conf["ssl.ca.location"] = str(ca)
        return conf

    def start(self, timeout: float = 60, *, detached: bool = False) -> str:
        """Format storage on first use, start the JVM and wait until it answers metadata; returns `bootstrap`."""
        if self.running:
            return self.bootstrap
        self.launch(detached=detached)
        self.wait_ready(timeout)
        return self.bootstrap

    def launch(self, *, detached: bool = False) -> None:
        """Format storage on first use and start the JVM without waiting (a cluster starts all, then waits)."""
        if self.running:
            return
        java, libs = self.prepare()
        out = (self.data_dir / "logs" / "kafka.out").open("ab")
        try:
            self._process = subprocess.Popen(
                [*self._java_command(java, libs), "kafka.Kafka", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=detached,
            )
        finally:
            out.close()
        if not detached:
            # A broker tied to this process must not outlive it, even if stop() is never called.
            self._finalizer = weakref.finalize(self, _kill_quietly, self._process)

    def prepare(self) -> tuple[str, Path]:
        """Write the config and format the storage on first use; the java binary and the jars."""
        java = _require_java()
        libs = self._libs or ensure_jars(progress=self._progress)
        self._write_config()
        if not (self.data_dir / "data" / "meta.properties").is_file():
            self._format(java, libs)
        return java, libs

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until the JVM answers metadata (and sees the whole cluster); stop it and raise if not."""
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM the broker, wait for its controlled shutdown, then SIGKILL if it hangs."""
        process, self._process = self._process, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def terminate(self) -> None:
        """SIGTERM the JVM without waiting (`stop` waits): a cluster's nodes shut down together."""
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()

    def kill(self) -> None:
        """SIGKILL the JVM (a crash: no controlled shutdown, nothing flushed)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalKafka({self.bootstrap}, node {self.node_id}, data_dir={self.data_dir}, pid={self.pid})"

    def _load_layout(self) -> _Layout | None:
        # A restart on the same data dir keeps its ports: clients and tests hold on to the bootstrap.
        path = self.data_dir / _LAYOUT_FILE
        if path.is_file():
            return _Layout.from_json(json.loads(path.read_text()))
        if self.config_path.is_file():  # a data dir from before layout.json: one standalone node
            properties = _read_properties(self.config_path)
            port = int(properties["advertised.listeners"].rsplit(":", 1)[1])
            controller_port = int(properties["controller.quorum.bootstrap.servers"].rsplit(":", 1)[1])
            return _Layout(node_id=1, port=port, controller_port=controller_port)
        return None

    def _new_layout(self) -> _Layout:
        if self._security is not None:
            port, controller_port, internal_port = _free_ports(3)
            return _Layout(node_id=1, port=port, controller_port=controller_port, internal_port=internal_port)
        port, controller_port = _free_ports(2)
        return _Layout(node_id=1, port=port, controller_port=controller_port)

    def _write_config(self) -> None:
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        layout_path = self.data_dir / _LAYOUT_FILE
        if not layout_path.is_file():
            layout_path.write_text(json.dumps(self._layout.to_json(), indent=2) + "\n")
        if not self.config_path.is_file():
            text = _server_properties(self._layout, log_dir=self.data_dir / "data", security=self._security)
            self.config_path.write_text(text)
            if self._security is not None:
                self.config_path.chmod(0o600)  # it holds the keystore password
        (self.data_dir / "log4j2.xml").write_text(_LOG4J2_XML.format(log_dir=self.data_dir / "logs"))

    def _java_command(self, java: str, libs: Path) -> list[str]:
        return [
            java,
            f"-Xms{max(128, self._heap_mb // 2)}m",
            f"-Xmx{self._heap_mb}m",
            *_JVM_FLAGS,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            f"{libs}/*",
        ]

    def _format(self, java: str, libs: Path) -> None:
        # Alone: --standalone makes this node the single voter of a dynamic quorum (KIP-853), which
        # is what controller.quorum.bootstrap.servers (rather than controller.quorum.voters) requires.
        # In a cluster every node is formatted with the cluster's id against the static voter list.
        # Share groups are a preview in 4.1; pin them off so a default change cannot surprise us.
        command = [*self._java_command(java, libs), "kafka.tools.StorageTool", "format"]
        if self._layout.voters is None:
            command.append("--standalone")
        command += ["-t", self._layout.cluster_id or _cluster_id(), "-c", str(self.config_path)]
        command += ["--feature", "share.version=0"]
        if self._security is not None:
            command += self._security.scram_arguments()
        self._run_tool(command)

    def _run_tool(self, command: list[str]) -> str:
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.data_dir, check=False)
        if result.returncode != 0:
            raise KafkaSetupError(
                f"Kafka StorageTool failed (exit {result.returncode}) in {self.data_dir}",
                log_tail=_tail_text((result.stdout + result.stderr).splitlines()),
            )
        return result.stdout

    def _wait_ready(self, timeout: float) -> None:
        started = time.monotonic()
        next_report = started + _PROGRESS_EVERY_S
        conf = self.client_config()
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise KafkaSetupError(
                    f"Kafka exited during start-up (exit {code}); a port may be taken or {self.data_dir} damaged",
                    log_path=self.log_path,
                    log_tail=self._log_tail(),
                )
            if _sees_brokers(conf, self._expected_brokers, timeout=1.0):
                return
            now = time.monotonic()
            if now - started > timeout:
                raise KafkaSetupError(
                    f"Kafka on {self.bootstrap} did not answer within {timeout:.0f} s",
                    log_path=self.log_path,
                    log_tail=self._log_tail(),
                )
            if now >= next_report:
                self._progress(f"waiting for Kafka on {self.bootstrap} ({now - started:.0f} s)")
                next_report += _PROGRESS_EVERY_S
            time.sleep(0.2)

    def _log_tail(self) -> str:
        parts = (_tail_file(self.data_dir / "logs" / "kafka.out", 15), _tail_file(self.log_path, 30))
        return "\n".join(part for part in parts if part)


class LocalKafkaCluster:
    """`brokers` KRaft nodes on 127.0.0.1, each combined broker+controller in its own JVM.

    All nodes are voters of one static controller quorum, so a majority (2 of 3) keeps the
    cluster's metadata moving when one node is down; topics default to replication factor
    `brokers` (at most 3) and min.insync.replicas 2, the internal topics likewise. Node `i` lives in
    `data_dir/node-<i>`; the layout is kept there, so a node restarted with `start_node` comes
    back on its ports with its data.
    """

    def __init__(
        self,
        data_dir: Path,
        brokers: int = 3,
        *,
        libs: Path | None = None,
        progress: Progress = print,
        heap_mb: int = _CLUSTER_HEAP_MB,
    ) -> None:
        if brokers < 1:
            raise KafkaSetupError("a cluster needs at least one broker")
        self.data_dir = Path(data_dir).resolve()
        self._progress = progress
        layouts = self._layouts(brokers)
        self.nodes = [
            LocalKafka(
                self.data_dir / f"node-{layout.node_id}",
                libs=libs,
                progress=progress,
                heap_mb=heap_mb,
                _layout=layout,
                _expected_brokers=brokers,
            )
            for layout in layouts
        ]

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated: clients find the cluster through any live one."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def pids(self) -> list[int | None]:
        """Each node's JVM process id (None for a node not running)."""
        return [node.pid for node in self.nodes]

    def start(self, timeout: float = 120, *, detached: bool = False) -> str:
        """Start every node (formatting on first use) and wait until each sees the whole cluster."""
        formats = [node for node in self.nodes if not (node.data_dir / "data" / "meta.properties").is_file()]
        if formats:
            self._progress(f"formatting {len(formats)} KRaft node(s) in {self.data_dir}")
            # One JVM start each (a few seconds): side by side, not one after the other.
            with concurrent.futures.ThreadPoolExecutor(len(formats)) as pool:
                for future in [pool.submit(node.prepare) for node in formats]:
                    future.result()
        try:
            for node in self.nodes:
                node.launch(detached=detached)
            for node in self.nodes:
                node.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def node(self, node_id: int) -> LocalKafka:
        """The node with this KRaft id (1..brokers)."""
        return self.nodes[node_id - 1]

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node's JVM (a crash)."""
        self.node(node_id).kill()

    def start_node(self, node_id: int, timeout: float = 120) -> None:
        """Start one node again on its data and ports; returns once it sees the whole cluster."""
        self.node(node_id).start(timeout)

    def stop(self, timeout: float = 20) -> None:
        """Stop every node (controlled shutdown, SIGKILL if one hangs).

        All at once: one by one, the last nodes would wait for a quorum that has already left."""
        for node in self.nodes:
            node.terminate()
        for node in self.nodes:
            node.stop(timeout)

    def __enter__(self) -> LocalKafkaCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalKafkaCluster({self.bootstrap}, data_dir={self.data_dir}, pids={self.pids})"

    def _layouts(self, brokers: int) -> list[_Layout]:
        existing = [self.data_dir / f"node-{i}" / _LAYOUT_FILE for i in range(1, brokers + 1)]
        if all(path.is_file() for path in existing):
            return [_Layout.from_json(json.loads(path.read_text())) for path in existing]
        ports = _free_ports(2 * brokers)
        voters = tuple((i + 1, ports[2 * i + 1]) for i in range(brokers))
        cluster_id = _cluster_id()
        return [
            _Layout(
                node_id=i + 1,
                port=ports[2 * i],
                controller_port=ports[2 * i + 1],
                voters=voters,
                cluster_id=cluster_id,
                replication=min(brokers, 3),
            )
            for i in range(brokers)
        ]


def _kill_quietly(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)


# Detached mode: a broker (or a cluster of them) that outlives the Python process, found again
# through a state file. A cluster's state lists its nodes; the first node's keys stay at the top
# level, as a single broker's always were.


def _state_path(state_dir: Path) -> Path:
    return Path(state_dir) / _STATE_FILE


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(_state_path(state_dir).read_text())
    except (OSError, ValueError):
        return None
    return state


def _state_nodes(state: dict[str, Any]) -> list[tuple[int, Path]]:
    """(pid, config) of every node of a state file (one for a single broker)."""
    nodes = state.get("nodes") or [state]
    return [(int(node["pid"]), Path(node["config"])) for node in nodes]


def _alive_nodes(state: dict[str, Any]) -> int:
    try:
        return sum(_is_broker(pid, config) for pid, config in _state_nodes(state))
    except (KeyError, TypeError, ValueError):
        return 0


def running_bootstrap(state_dir: Path) -> str | None:
    """The bootstrap of the broker(s) `up` started in `state_dir` while one lives; else None.

    Cheap (a state file and a process check, no network): every command calls it to find Kafka.
    """
    state = _read_state(state_dir)
    if state is None:
        return None
    return str(state["bootstrap"]) if _alive_nodes(state) else None


def up(state_dir: Path, progress: Progress = print, *, timeout: float = 60, brokers: int = 1) -> str:
    """Start a broker, or a cluster of `brokers` nodes, that outlives this process (or find the one
    already running); returns its bootstrap."""
    state_dir = Path(state_dir).resolve()
    state = _read_state(state_dir)
    if state is not None and _alive_nodes(state):
        running = int(state.get("brokers", 1))
        if running != brokers:
            raise KafkaSetupError(
                f"a local Kafka of {running} broker(s) already runs from {state_dir}; stop it first "
                "with `ranksight kafka down`"
            )
        return str(state["bootstrap"])
    nodes: list[LocalKafka]
    if brokers == 1:
        broker = LocalKafka(state_dir / "kafka", progress=progress)
        bootstrap = broker.start(timeout, detached=True)
        nodes = [broker]
    else:
        cluster = LocalKafkaCluster(state_dir / f"kafka-{brokers}", brokers, progress=progress)
        bootstrap = cluster.start(max(timeout, 120), detached=True)
        nodes = cluster.nodes
    described = [
        {
            "node_id": node.node_id,
            "pid": node.pid,
            "bootstrap": node.bootstrap,
            "data_dir": str(node.data_dir),
            "config": str(node.config_path),
            "log": str(node.log_path),
        }
        for node in nodes
    ]
    first = described[0]
    state = {
        "pid": first["pid"],
        "bootstrap": bootstrap,
        "data_dir": first["data_dir"],
        "config": first["config"],
        "log": first["log"],
        "brokers": brokers,
        "started_at": time.time(),
    }
    if brokers > 1:
        state["nodes"] = described
    path = _state_path(state_dir)
    path.with_suffix(".tmp").write_text(json.dumps(state, indent=2) + "\n")
    path.with_suffix(".tmp").replace(path)
    return bootstrap


def down(state_dir: Path, *, timeout: float = 20) -> bool:
    """Stop the detached broker(s) of this state dir and remove its state file; False when none was running."""
    state = _read_state(state_dir)
    if state is None:
        return False
    nodes = _state_nodes(state)
    was_running = any(_is_broker(pid, config) for pid, config in nodes)
    for pid, config in nodes:  # all at once (see LocalKafkaCluster.stop), then wait for each
        if _is_broker(pid, config):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    for pid, config in nodes:
        _terminate(pid, config, timeout)
    _state_path(state_dir).unlink(missing_ok=True)
    return was_running


def status(state_dir: Path) -> dict[str, Any] | None:
    """The detached broker's state (pid, bootstrap, data_dir, log, alive, ready; a cluster's nodes
    each with alive), or None when never started."""
    state = _read_state(state_dir)
    if state is None:
        return None
    brokers = int(state.get("brokers", 1))
    alive_count = _alive_nodes(state)
    out = {**state, "alive": alive_count == len(_state_nodes(state))}
    if "nodes" in state:
        out["nodes"] = [
            {**node, "alive": _is_broker(int(node["pid"]), Path(node["config"]))} for node in state["nodes"]
        ]
    out["ready"] = bool(alive_count) and _sees_brokers(
        {"bootstrap.servers": str(state["bootstrap"])}, brokers if out["alive"] else 1, timeout=2.0
    )
    return out
