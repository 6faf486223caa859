"""A local single-node Kafka (KRaft, combined broker and controller) started from Maven Central jars."""

from __future__ import annotations

import base64
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
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from infra.errors import KafkaSetupError

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = [
    "KAFKA_VERSION",
    "LocalKafka",
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
_JVM_FLAGS = (
    "-Xms256m",
    "-Xmx512m",
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


def _admin(bootstrap: str) -> AdminClient:
    # Imported here: `ranksight --help` and every light command import this module.
    from confluent_kafka.admin import AdminClient

    # log_level 0 keeps librdkafka's connection-refused chatter off our stderr while we poll.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "reconnect.backoff.max.ms": 500})


def _answers_metadata(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka import KafkaException

    try:
        _admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def _server_properties(*, port: int, controller_port: int, log_dir: Path) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://{_HOST}:{port},CONTROLLER://{_HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{_HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.quorum.bootstrap.servers": f"{_HOST}:{controller_port}",
        "log.dirs": str(log_dir),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "4",
        "num.partitions": "3",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
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
    """One KRaft broker+controller on 127.0.0.1 whose data, config and ports live in `data_dir`."""

    def __init__(self, data_dir: Path, *, libs: Path | None = None, progress: Progress = print) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._libs = libs
        self._progress = progress
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._port, self._controller_port = self._ports()

    @property
    def config_path(self) -> Path:
        """The broker's server.properties."""
        return self.data_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        """The broker's own log (log4j2), kept off our stdout."""
        return self.data_dir / "logs" / "server.log"

    @property
    def bootstrap(self) -> str:
        """The address clients connect to, `127.0.0.1:PORT`."""
        return f"{_HOST}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the JVM is alive."""
        return self.pid is not None

    def start(self, timeout: float = 60, *, detached: bool = False) -> str:
        """Format storage on first use, start the JVM and wait until it answers metadata; returns `bootstrap`."""
        if self.running:
            return self.bootstrap
        java = _require_java()
        libs = self._libs or ensure_jars(progress=self._progress)
        self._write_config()
        if not (self.data_dir / "data" / "meta.properties").is_file():
            self._format(java, libs)
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
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

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

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalKafka({self.bootstrap}, data_dir={self.data_dir}, pid={self.pid})"

    def _ports(self) -> tuple[int, int]:
        # A restart on the same data dir keeps its ports: clients and tests hold on to the bootstrap.
        if self.config_path.is_file():
            properties = _read_properties(self.config_path)
            port = int(properties["advertised.listeners"].rsplit(":", 1)[1])
            controller_port = int(properties["controller.quorum.bootstrap.servers"].rsplit(":", 1)[1])
            return port, controller_port
        port, controller_port = _free_ports(2)
        return port, controller_port

    def _write_config(self) -> None:
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        if not self.config_path.is_file():
            text = _server_properties(
                port=self._port, controller_port=self._controller_port, log_dir=self.data_dir / "data"
            )
            self.config_path.write_text(text)
        (self.data_dir / "log4j2.xml").write_text(_LOG4J2_XML.format(log_dir=self.data_dir / "logs"))

    def _java_command(self, java: str, libs: Path) -> list[str]:
        return [
            java,
            *_JVM_FLAGS,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            f"{libs}/*",
        ]

    def _format(self, java: str, libs: Path) -> None:
        # --standalone makes this node the single voter of a dynamic quorum (KIP-853), which is what
        # controller.quorum.bootstrap.servers (rather than controller.quorum.voters) requires.
        # Share groups are a preview in 4.1; pin them off so a default change cannot surprise us.
        command = [*self._java_command(java, libs), "kafka.tools.StorageTool", "format", "--standalone"]
        command += ["-t", _cluster_id(), "-c", str(self.config_path), "--feature", "share.version=0"]
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
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise KafkaSetupError(
                    f"Kafka exited during start-up (exit {code}); a port may be taken or {self.data_dir} damaged",
                    log_path=self.log_path,
                    log_tail=self._log_tail(),
                )
            if _answers_metadata(self.bootstrap, timeout=1.0):
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


def _kill_quietly(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)


# Detached mode: a broker that outlives the Python process, found again through a state file.


def _state_path(state_dir: Path) -> Path:
    return Path(state_dir) / _STATE_FILE


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(_state_path(state_dir).read_text())
    except (OSError, ValueError):
        return None
    return state


def running_bootstrap(state_dir: Path) -> str | None:
    """The bootstrap of the broker `up` started in `state_dir` while its process lives; else None.

    Cheap (a state file and a process check, no network): every command calls it to find Kafka.
    """
    state = _read_state(state_dir)
    if state is None:
        return None
    try:
        alive = _is_broker(int(state["pid"]), Path(state["config"]))
    except (KeyError, TypeError, ValueError):
        return None
    return str(state["bootstrap"]) if alive else None


def up(state_dir: Path, progress: Progress = print, *, timeout: float = 60) -> str:
    """Start a broker that outlives this process (or find the one already running); returns its bootstrap."""
    state_dir = Path(state_dir).resolve()
    state = _read_state(state_dir)
    if state is not None and _is_broker(int(state["pid"]), Path(state["config"])):
        return str(state["bootstrap"])
    broker = LocalKafka(state_dir / "kafka", progress=progress)
    bootstrap = broker.start(timeout, detached=True)
    assert broker.pid is not None
    state = {
        "pid": broker.pid,
        "bootstrap": bootstrap,
        "data_dir": str(broker.data_dir),
        "config": str(broker.config_path),
        "log": str(broker.log_path),
        "started_at": time.time(),
    }
    path = _state_path(state_dir)
    path.with_suffix(".tmp").write_text(json.dumps(state, indent=2) + "\n")
    path.with_suffix(".tmp").replace(path)
    return bootstrap


def down(state_dir: Path, *, timeout: float = 20) -> bool:
    """Stop the detached broker of this state dir and remove its state file; False when none was running."""
    state = _read_state(state_dir)
    if state is None:
        return False
    pid, config = int(state["pid"]), Path(state["config"])
    was_running = _is_broker(pid, config)
    _terminate(pid, config, timeout)
    _state_path(state_dir).unlink(missing_ok=True)
    return was_running


def status(state_dir: Path) -> dict[str, Any] | None:
    """The detached broker's state (pid, bootstrap, data_dir, log, alive, ready), or None when never started."""
    state = _read_state(state_dir)
    if state is None:
        return None
    alive = _is_broker(int(state["pid"]), Path(state["config"]))
    return {
        **state,
        "alive": alive,
        "ready": alive and _answers_metadata(str(state["bootstrap"]), timeout=2.0),
    }
