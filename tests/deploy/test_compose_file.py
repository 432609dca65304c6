"""docker-compose.yml and the images it builds, checked for consistency without Docker.

The file is read the way ``docker compose`` reads it: YAML with anchors and merge keys,
then ``${VAR:-default}`` / ``${VAR:?message}`` interpolation with an environment that
holds only the secrets ``bin/make-env`` generates (``devtools/env_file.py``), as
``docker compose up`` reads a fresh ``.env``; everything else takes its default. Each
``check_*`` function returns a list of problems (empty: fine), so a wrong file fails
with every reason at once; the mutation tests at the end break a copy of the loaded
file in one way each and assert that the matching check notices.

What is checked, against what:

* the services of the topology exist; ``depends_on`` names existing services with
  conditions that can be met (a ``service_healthy`` target has a health check), brings
  things up in order (postgres -> airflow-init -> Airflow; spark-master -> workers and
  the Connect server) and has no cycle; every long-running service has a health check;
* host ports do not collide; the scalable services (``spark-worker``,
  ``airflow-worker``) have neither a container name nor a published port; published
  container ports are the ones the processes listen on;
* named volumes are declared; the shared data volume is mounted at the same path in
  every Airflow service, the Spark workers and the Connect server, and the
  ``[dbspark]`` paths lie on it;
* image tags are pinned; the Airflow base image's tag is the ``apache-airflow`` pin of
  ``requirements.lock``, the Spark image installs the lock's ``pyspark``, both Pythons
  have the minor version of ``requires-python``; every image that runs dbspark code
  installs the project against the lock;
* every ``[dbspark]`` key the code reads (found by scanning ``include/dbspark``) is set
  in every Airflow service, or is listed in ``OPTIONAL_DBSPARK_KEYS`` with a reason;
* the Spark and catalog connections (``deployment.DEFAULT_*_CONN_ID`` unless
  ``[dbspark]`` names others) are set and parse, and point at the Connect server's port
  and at a database, role and password that the PostgreSQL init script creates; so do
  Airflow's metadata database, the Celery broker and result backend and the Execution
  API URL;
* every ``python -m dbspark...`` command names a module in ``include/`` and only
  options that module defines; Spark executors fit in a worker;
* every variable has a default, and ``deploy/env.example`` lists each with that default,
  except the secrets: those have none (``${NAME:?message}``, so compose refuses to start
  without them), are exactly what ``bin/make-env`` generates, and every setting that
  holds a password, secret, key or token (or a URL with a password) comes from one;
* published ports are bound to the host's loopback unless a variable says otherwise;
  Airflow asks for a login (SimpleAuthManager with ``SIMPLE_AUTH_MANAGER_ALL_ADMINS``
  false: true would make every visitor an admin);
* Spark publishes nothing (neither Spark Connect, which has no authentication of its
  own here, nor the UIs), and every Spark daemon and the driver run with one
  ``spark.authenticate`` secret.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography.fernet import Fernet

from dbspark.devtools.env_file import SECRETS, generate_secrets
from dbspark.orchestration.airflow.deployment import DEFAULT_CATALOG_CONN_ID, DEFAULT_SPARK_CONN_ID
from dbspark.orchestration.sources import sqlalchemy_url

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
LOCK = REPO / "requirements.lock"
PYPROJECT = REPO / "pyproject.toml"
INCLUDE = REPO / "include"
INIT_SCRIPTS = REPO / "deploy" / "postgres" / "initdb"
ENV_EXAMPLE = REPO / "deploy" / "env.example"
#: The environment the file is checked with: a fresh .env, as bin/make-env writes it.
GENERATED_SECRETS = generate_secrets()
#: Settings (environment keys) that hold a credential by their name.
SECRET_SETTING = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY|TOKEN)$")
#: Host addresses a port may be published on without anyone asking.
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1", "[::1]", "localhost")

AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)
SPARK_SERVICES = ("spark-master", "spark-worker", "spark-connect")
REQUIRED_SERVICES = ("postgres", "redis", *AIRFLOW_SERVICES, *SPARK_SERVICES)
#: Services that ``docker compose up --scale NAME=N`` must be able to multiply.
SCALABLE = ("spark-worker", "airflow-worker")
#: Services whose processes read or write the warehouse, landing and outputs.
SHARED_VOLUME_USERS = (*AIRFLOW_SERVICES, "spark-worker", "spark-connect")

HEALTHY = "service_healthy"
COMPLETED = "service_completed_successfully"
STARTED = "service_started"
_AIRFLOW_BASE_DEPENDENCIES = {"postgres": HEALTHY, "redis": HEALTHY, "airflow-init": COMPLETED}
#: The start-up order: each service waits for these, in these states.
REQUIRED_DEPENDENCIES: dict[str, dict[str, str]] = {
    "airflow-init": {"postgres": HEALTHY},
    **{name: dict(_AIRFLOW_BASE_DEPENDENCIES) for name in AIRFLOW_SERVICES[1:]},
    "airflow-worker": {
        **_AIRFLOW_BASE_DEPENDENCIES,
        "airflow-apiserver": HEALTHY,  # tasks report to its Execution API
        "spark-connect": HEALTHY,  # tasks are its clients
    },
    "spark-worker": {"spark-master": HEALTHY},
    "spark-connect": {"spark-master": HEALTHY},
}

#: Published container ports must be what the process listens on (its command's flag).
PORT_FLAGS = {
    "airflow-apiserver": "--port",
    "spark-master": "--webui-port",
    "spark-connect": "--ui-port",
}

#: ``[dbspark]`` keys the code reads that compose may leave unset, and why.
OPTIONAL_DBSPARK_KEYS = {
    "serving_conn_id": "serving tables are optional: no serving database by default",
    "conn_id": "the compose file sets warehouse, outputs and catalog_conn_id themselves; "
    "a 'dbspark' connection is the alternative",
    "late_files": "late files are reported as warnings by default ('warn')",
    "redact_input_values": "off by default: an input error shows the offending values",
    "execution_timeouts": "every task kind has a default timeout (orchestration/airflow/policy.py)",
    "table_retention_hours": "DBSPARK_TABLE_RETENTION_HOURS, else 168 hours",
    "table_maintain_every": "DBSPARK_TABLE_MAINTAIN_EVERY, else every 10th epoch",
    "table_target_file_bytes": "DBSPARK_TABLE_TARGET_FILE_BYTES, else 32 MiB",
    "maintain_every": "the maintain task runs after every 10th epoch by default",
    "gc_min_age_hours": "garbage collection keeps what is younger than 6 hours by default",
    "changes_retention_hours": "change directories are kept 168 hours by default",
    "input_log_retention_hours": "raw input logs are merged after 168 hours by default",
    "sqlite_on_shared_filesystem": "compose's catalog is PostgreSQL; only SQLite reads it",
    "sync_method": "DBSPARK_SYNC_METHOD, else syncfs where Linux reports its errors and "
    "little else is dirty",
    "table_location": "tables are written under [dbspark] outputs by default",
    "table_storage_options": "none needed for a local or shared-filesystem location",
    "table_conn_id": "no object store credentials for a local or shared-filesystem location",
}
#: Keys the scan must find, or the scan itself is broken.
KNOWN_DBSPARK_KEYS = {"warehouse", "landing", "outputs", "catalog_conn_id", "spark_conn_id"}
_DBSPARK_KEY_PATTERNS = (
    re.compile(r"""conf\.get(?:boolean|int|float)?\(\s*["']dbspark["']\s*,\s*["'](\w+)["']"""),
    re.compile(r"""\bdbspark_(?:setting|flag)\(\s*["'](\w+)["']"""),
    re.compile(r"""\b_airflow_setting\(\s*["'](\w+)["']"""),
)

SIMPLE_AUTH_MANAGER = (
    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
)


# ============================================================================ loading
_VARIABLE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_]\w*))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>.*))?$", re.DOTALL)


@dataclass(frozen=True)
class Use:
    """One ``${NAME<op><arg>}``: ``op`` is ``""`` (bare), ``:-``/``-`` (``arg`` is the
    default), ``:?``/``?`` (``arg`` is the message when unset) or ``:+``/``+``."""

    op: str
    arg: str

    @property
    def default(self) -> str | None:
        return self.arg if self.op in (":-", "-") else None


@dataclass
class Interpolation:
    """Compose's variable interpolation with an environment (default: empty)."""

    env: Mapping[str, str] = field(default_factory=dict)
    #: name -> every use of it.
    uses: dict[str, list[Use]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def string(self, text: str, where: str = "") -> str:
        def replace(match: re.Match[str]) -> str:
            if match.group("dollar"):
                return "$"
            inner = match.group("braced")
            if inner is None:
                inner = match.group("plain")
            parsed = _BRACED.match(inner)
            if parsed is None:
                self.problems.append(f"{where}: cannot interpolate ${{{inner}}}")
                return ""
            name, op, arg = parsed.group("name", "op", "arg")
            value = self.env.get(name)
            self.uses.setdefault(name, []).append(Use(op or "", arg or ""))
            if op == ":-":
                return value if value else arg
            if op == "-":
                return arg if value is None else value
            if op in (":?", "?"):
                if not value:
                    self.problems.append(f"{where}: ${{{name}}} is required ({arg})")
                return value or ""
            if op in (":+", "+"):
                return arg if value else ""
            if value is None:
                self.problems.append(f"{where}: ${{{name}}} has no default")
            return value or ""

        return _VARIABLE.sub(replace, text)

    def resolve(self, node: Any, where: str = "") -> Any:
        if isinstance(node, str):
            return self.string(node, where)
        if isinstance(node, dict):
            return {
                k: self.resolve(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()
            }
        if isinstance(node, list):
            return [self.resolve(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node


def parse_lock(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


def python_minor(requires_python: str) -> str | None:
    """``>=3.11,<3.12`` -> ``3.11``: the one minor version the project allows."""
    low = re.search(r">=\s*3\.(\d+)", requires_python)
    high = re.search(r"<\s*3\.(\d+)", requires_python)
    if not low or not high or int(high.group(1)) != int(low.group(1)) + 1:
        return None
    return f"3.{low.group(1)}"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (heredocs are
    not supported: the Dockerfiles here do not use them)."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    return instructions


def dockerfile_from(instructions: list[Instruction]) -> str | None:
    """The (last) base image, with ``ARG`` defaults declared before it substituted."""
    args: dict[str, str] = {}
    base = None
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, value = ins.args.split("=", 1)
            args[name.strip()] = value.strip().strip('"')
        if ins.keyword == "FROM":
            image = ins.args.split()[0]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
    return base


def dockerfile_args(instructions: list[Instruction]) -> dict[str, str]:
    found = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, value = ins.args.split("=", 1)
            found[name.strip()] = value.strip().strip('"')
    return found


@dataclass
class Deployment:
    """Everything the checks look at, loaded once; mutation tests alter a deep copy."""

    compose: dict[str, Any]
    raw_compose: dict[str, Any]
    interpolation: Interpolation
    dockerfiles: dict[str, list[Instruction]]
    init_scripts: dict[str, str]
    lock: dict[str, str]
    requires_python: str
    sources: dict[str, str]
    env_example: str

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return self.compose.get("services") or {}

    def service(self, name: str) -> dict[str, Any]:
        return self.services.get(name) or {}


def load(env: Mapping[str, str] | None = None, text: str | None = None) -> Deployment:
    """The deployment as compose reads it with ``env`` (default: the generated secrets),
    from ``text`` (default: docker-compose.yml)."""
    raw = yaml.safe_load(COMPOSE.read_text() if text is None else text)
    interpolation = Interpolation(GENERATED_SECRETS if env is None else env)
    compose = interpolation.resolve(copy.deepcopy(raw))
    dockerfiles = {}
    for service in (compose.get("services") or {}).values():
        build = service.get("build")
        if isinstance(build, dict):
            path = REPO / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
        elif isinstance(build, str):
            path = REPO / build / "Dockerfile"
        else:
            continue
        key = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        if path.is_file() and key not in dockerfiles:
            dockerfiles[key] = parse_dockerfile(path.read_text())
    pyproject = tomllib.loads(PYPROJECT.read_text())
    return Deployment(
        compose=compose,
        raw_compose=raw,
        interpolation=interpolation,
        dockerfiles=dockerfiles,
        init_scripts={p.name: p.read_text() for p in sorted(INIT_SCRIPTS.glob("*.sh"))},
        lock=parse_lock(LOCK.read_text()),
        requires_python=pyproject["project"]["requires-python"],
        sources={
            str(p.relative_to(REPO)): p.read_text()
            for p in sorted(INCLUDE.rglob("dbspark/**/*.py"))
        },
        env_example=ENV_EXAMPLE.read_text() if ENV_EXAMPLE.exists() else "",
    )


# ============================================================================ helpers
def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) for item in env)
        return {p[0]: (p[1] if len(p) > 1 else "") for p in pairs}
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def command_tokens(service: Mapping[str, Any]) -> list[str]:
    """The command as arguments; an ``sh -c``/``bash -c`` script is split like a shell
    would (near enough for finding options)."""
    command = service.get("command") or []
    tokens = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    if (
        len(tokens) >= 3
        and tokens[0] in ("sh", "bash", "/bin/sh", "/bin/bash")
        and tokens[1] == "-c"
    ):
        try:
            return shlex.split(tokens[2])
        except ValueError:
            return tokens[2].split()
    return tokens


def option(tokens: list[str], name: str) -> str | None:
    """The value of ``name`` (``--x v`` or ``--x=v``), the last one given."""
    value = None
    for i, token in enumerate(tokens):
        if token == name and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith(name + "="):
            value = token.split("=", 1)[1]
    return value


def options(tokens: list[str], name: str) -> list[str]:
    return [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == name]


def texts_of(service: Mapping[str, Any]) -> Iterable[str]:
    """Every command line a service runs: command, entrypoint, health check."""
    for key in ("command", "entrypoint"):
        value = service.get(key)
        if value:
            yield value if isinstance(value, str) else " ".join(map(str, value))
    test = (service.get("healthcheck") or {}).get("test")
    if test:
        yield test if isinstance(test, str) else " ".join(map(str, test))


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: STARTED for name in deps}
    return {name: (spec or {}).get("condition", STARTED) for name, spec in deps.items()}


@dataclass(frozen=True)
class Mount:
    source: str | None
    target: str
    read_only: bool
    named: bool


def mounts(service: Mapping[str, Any]) -> list[Mount]:
    found = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            source = entry.get("source")
            found.append(
                Mount(
                    source,
                    str(entry.get("target")),
                    bool(entry.get("read_only")),
                    entry.get("type", "volume") == "volume" and bool(source),
                )
            )
            continue
        parts = str(entry).split(":")
        if len(parts) == 1:
            found.append(Mount(None, parts[0], False, False))
            continue
        source, target = parts[0], parts[1]
        mode = parts[2] if len(parts) > 2 else ""
        named = not source.startswith((".", "/", "~", "$"))
        found.append(Mount(source, target, "ro" in mode.split(","), named))
    return found


@dataclass(frozen=True)
class Port:
    ip: str | None
    published: str | None
    target: str
    protocol: str


def ports(service: Mapping[str, Any]) -> list[Port]:
    found = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            published = entry.get("published")
            found.append(
                Port(
                    entry.get("host_ip"),
                    None if published in (None, "") else str(published),
                    str(entry.get("target")),
                    entry.get("protocol", "tcp"),
                )
            )
            continue
        spec, _, protocol = str(entry).partition("/")
        parts = spec.rsplit(":", 2)
        if len(parts) == 1:
            found.append(Port(None, None, parts[0], protocol or "tcp"))
        elif len(parts) == 2:
            found.append(Port(None, parts[0], parts[1], protocol or "tcp"))
        else:
            found.append(Port(parts[0], parts[1], parts[2], protocol or "tcp"))
    return found


def size_bytes(text: str) -> int | None:
    match = re.fullmatch(r"(\d+)\s*([kmgt]?)b?", text.strip().lower())
    if not match:
        return None
    return int(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")


def has_healthcheck(service: Mapping[str, Any]) -> bool:
    check = service.get("healthcheck") or {}
    test = check.get("test")
    if check.get("disable") or not test:
        return False
    return not (test == ["NONE"] or test == "NONE")


def image_of(service: Mapping[str, Any]) -> str:
    return str(service.get("image") or "")


def is_pinned(image: str) -> bool:
    """``name:tag`` with a tag that names a version (at least major.minor), or a digest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:  # no tag at all (a registry port is not a tag)
        return False
    return tag != "latest" and re.match(r"^v?\d+\.\d+", tag) is not None


def dockerfile_of(service: Mapping[str, Any]) -> str | None:
    """The service's Dockerfile, relative to the repository (None: not built here)."""
    build = service.get("build")
    if isinstance(build, dict):
        path = Path(build.get("context", ".")) / build.get("dockerfile", "Dockerfile")
    elif isinstance(build, str):
        path = Path(build) / "Dockerfile"
    else:
        return None
    return str(path)  # Path drops a leading ./, as load() keys it


def runs(instructions: list[Instruction]) -> list[tuple[str, str]]:
    """``(user, command)`` of each RUN, with the user in effect."""
    user = "root"
    found = []
    for ins in instructions:
        if ins.keyword == "USER":
            user = ins.args.split(":")[0]
        elif ins.keyword == "RUN":
            found.append((user, ins.args))
    return found


def installs_project(instructions: list[Instruction]) -> bool:
    """Copies ``include/`` and pip-installs against ``requirements.lock``."""
    copies = any(
        ins.keyword == "COPY" and re.search(r"(^|\s)include(\s|$)", ins.args)
        for ins in instructions
    )
    return copies and any(
        re.search(r"pip install[^&;]*-c\s+\S*requirements\.lock", cmd)
        for _, cmd in runs(instructions)
    )


def init_databases(deployment: Deployment) -> dict[str, tuple[str, str]]:
    """``database -> (role, password variable)`` from the init script's
    ``create_database DB ROLE "$VAR"`` lines."""
    found = {}
    pattern = re.compile(r'^create_database\s+(\w+)\s+(\w+)\s+"\$\{?(\w+)\}?"', re.MULTILINE)
    for text in deployment.init_scripts.values():
        for database, role, variable in pattern.findall(text):
            found[database] = (role, variable)
    return found


def postgres_services(deployment: Deployment) -> list[str]:
    return [n for n, s in deployment.services.items() if image_of(s).startswith("postgres:")]


def check_database_url(deployment: Deployment, url: str, what: str) -> list[str]:
    """A PostgreSQL URL of a database the init script creates, as its role and with the
    password the postgres service hands the script."""
    problems = []
    try:
        parsed = sqlalchemy_url(url)
    except Exception as err:
        return [f"{what}: {url!r} does not parse: {err}"]
    if parsed.drivername not in ("postgresql+psycopg", "postgresql+psycopg_async"):
        problems.append(
            f"{what}: driver {parsed.drivername!r}; the project installs psycopg 3 "
            "(postgresql+psycopg)"
        )
    if parsed.host not in postgres_services(deployment):
        problems.append(f"{what}: host {parsed.host!r} is not a PostgreSQL service")
        return problems
    if parsed.port not in (None, 5432):
        problems.append(f"{what}: port {parsed.port}, PostgreSQL listens on 5432")
    databases = init_databases(deployment)
    if parsed.database not in databases:
        problems.append(
            f"{what}: database {parsed.database!r} is not created by the init script "
            f"(it creates {sorted(databases)})"
        )
        return problems
    role, variable = databases[parsed.database]
    if parsed.username != role:
        problems.append(
            f"{what}: user {parsed.username!r}, but {parsed.database} belongs to {role}"
        )
    postgres_env = environment(deployment.service(parsed.host))
    if variable not in postgres_env:
        problems.append(
            f"{what}: service {parsed.host} does not set {variable} for the init script"
        )
    elif parsed.password != postgres_env[variable]:
        problems.append(
            f"{what}: the password differs from {variable} given to {parsed.host} for role {role}"
        )
    return problems


# ============================================================================ checks
Check = Callable[[Deployment], list[str]]


def check_variables(deployment: Deployment) -> list[str]:
    """Every variable but a secret has a default, the same one wherever it is used, and
    deploy/env.example lists it with that default; a secret is listed without a value
    (check_secrets holds secrets to having none)."""
    problems = list(deployment.interpolation.problems)
    listed = dict(
        re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$", deployment.env_example, flags=re.MULTILINE)
    )
    for name, uses in sorted(deployment.interpolation.uses.items()):
        if name in SECRETS:
            if name not in listed:
                problems.append(f"the secret {name} is not listed in deploy/env.example")
            elif listed[name].strip():
                problems.append(f"deploy/env.example gives the secret {name} a value")
            continue
        defaults = [use.default for use in uses]
        if any(d is None for d in defaults):
            problems.append(f"${{{name}}} is used without a default")
            continue
        if len(set(defaults)) > 1:
            problems.append(f"${{{name}}} has different defaults: {sorted(set(defaults))}")
        if name not in listed:
            problems.append(f"${{{name}}} is not listed in deploy/env.example")
        elif listed[name].strip() != defaults[0]:
            problems.append(
                f"${{{name}}}: deploy/env.example says {listed[name].strip()!r}, "
                f"compose's default is {defaults[0]!r}"
            )
    for name in sorted(set(listed) - set(deployment.interpolation.uses)):
        problems.append(f"deploy/env.example lists {name}, which docker-compose.yml does not use")
    return problems


def check_services(deployment: Deployment) -> list[str]:
    return [
        f"service {name} is missing"
        for name in REQUIRED_SERVICES
        if name not in deployment.services
    ]


def check_dependencies(deployment: Deployment) -> list[str]:
    problems = []
    services = deployment.services
    for name, service in services.items():
        for target, condition in depends_on(service).items():
            if target not in services:
                problems.append(f"{name} depends on {target}, which is not a service")
                continue
            if condition not in (STARTED, HEALTHY, COMPLETED):
                problems.append(f"{name} -> {target}: unknown condition {condition!r}")
            if condition == HEALTHY and not has_healthcheck(services[target]):
                problems.append(f"{name} waits for {target} to be healthy; it has no health check")
            if condition == COMPLETED and services[target].get("restart", "no") not in ("no",):
                problems.append(
                    f"{name} waits for {target} to complete, but {target} restarts "
                    f"({services[target].get('restart')!r})"
                )
    for name, required in REQUIRED_DEPENDENCIES.items():
        if name not in services:
            continue
        actual = depends_on(services[name])
        for target, condition in required.items():
            if actual.get(target) != condition:
                problems.append(
                    f"{name} must wait for {target} ({condition}); it has "
                    f"{actual.get(target) or 'no dependency'}"
                )
    # No cycles (compose refuses them).
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in depends_on(services.get(node) or {}):
            if target not in services:
                continue
            if state.get(target) == "open":
                problems.append("dependency cycle: " + " -> ".join([*path, node, target]))
            elif target not in state:
                visit(target, [*path, node])
        state[node] = "done"

    for name in services:
        if name not in state:
            visit(name, [])
    return problems


def check_healthchecks(deployment: Deployment) -> list[str]:
    """Every long-running service says when it is ready (one-shot services excepted)."""
    return [
        f"{name} has no health check"
        for name, service in deployment.services.items()
        if service.get("restart", "no") != "no" and not has_healthcheck(service)
    ]


def check_ports(deployment: Deployment) -> list[str]:
    problems = []
    taken: dict[tuple[str, str], str] = {}
    for name, service in deployment.services.items():
        for port in ports(service):
            if port.published is None:
                continue
            # Conservative: the same host port on two host addresses counts as a clash.
            key = (port.published, port.protocol)
            if key in taken and taken[key] != name:
                problems.append(
                    f"host port {port.published}/{port.protocol} is published by both "
                    f"{taken[key]} and {name}"
                )
            taken.setdefault(key, name)
        flag = PORT_FLAGS.get(name)
        if flag is not None:
            listening = option(command_tokens(service), flag)
            for port in ports(service):
                if port.target != listening:
                    problems.append(
                        f"{name} publishes container port {port.target}, but listens on "
                        f"{listening} ({flag})"
                    )
    for name in SCALABLE:
        service = deployment.service(name)
        if "container_name" in service:
            problems.append(f"{name} has a container_name, so it cannot be scaled")
        if service.get("ports"):
            problems.append(f"{name} publishes ports {service['ports']}, so it cannot be scaled")
        if (service.get("deploy") or {}).get("replicas") is not None:
            problems.append(f"{name} fixes deploy.replicas; scale it with --scale")
    for name, service in deployment.services.items():
        if service.get("network_mode") == "host":
            problems.append(f"{name} uses the host's network: that assumes one machine")
    return problems


def check_published_addresses(deployment: Deployment) -> list[str]:
    """Every published port is bound to the host's loopback: reaching a service from
    another machine is a choice someone makes (a variable), never a default."""
    problems = []
    for name, service in deployment.services.items():
        for port in ports(service):
            if port.published is None:
                problems.append(
                    f"{name} publishes container port {port.target} on a random host port"
                )
            if port.ip not in LOOPBACK_ADDRESSES:
                where = "every interface" if port.ip in (None, "", "0.0.0.0", "::") else port.ip
                problems.append(
                    f"{name} publishes port {port.published or port.target} on {where}, "
                    "not on the host's loopback"
                )
    return problems


def check_spark_security(deployment: Deployment) -> list[str]:
    """The Spark services publish no port, and each runs with the cluster's
    ``spark.authenticate`` secret (the launchers refuse to start without one unless
    ``--no-auth``, which no service may pass)."""
    problems = []
    secrets_seen = set()
    for name in SPARK_SERVICES:
        service = deployment.service(name)
        if service.get("ports"):
            problems.append(f"{name} publishes {service['ports']}: Spark stays on the network")
        secret = environment(service).get("DBSPARK_SPARK_AUTH_SECRET", "")
        if not secret:
            problems.append(f"{name}: DBSPARK_SPARK_AUTH_SECRET is not set (spark.authenticate)")
        secrets_seen.add(secret)
        if "--no-auth" in command_tokens(service):
            problems.append(f"{name} runs with --no-auth")
    if len(secrets_seen) > 1:
        problems.append("the Spark services do not share one DBSPARK_SPARK_AUTH_SECRET")
    return problems


def secret_values(deployment: Deployment) -> set[str]:
    return {deployment.interpolation.env.get(name, "") for name in SECRETS} - {""}


def check_secrets(deployment: Deployment) -> list[str]:
    """No secret has a default: every variable bin/make-env generates is required
    (``${NAME:?message}``) wherever it is used, every variable whose name says it is a
    secret is one of them, and every setting that holds a credential (by its name, or a
    password inside a URL) takes it from one of them, never from a literal."""
    problems = []
    uses = deployment.interpolation.uses
    for name, found in sorted(uses.items()):
        looks_secret = bool(SECRET_SETTING.search(name))
        if looks_secret and name not in SECRETS:
            problems.append(f"${{{name}}} looks like a secret, but bin/make-env does not make it")
        if name in SECRETS:
            for use in dict.fromkeys(found):
                if use.op != ":?" or not use.arg.strip():
                    problems.append(
                        f"${{{name}}} is a secret, so it must be ${{{name}:?message}}, not "
                        f"${{{name}{use.op}{use.arg}}}"
                    )
    for name in sorted(set(SECRETS) - set(uses)):
        problems.append(f"bin/make-env makes {name}, which docker-compose.yml does not use")
    generated = secret_values(deployment)
    for service_name, service in deployment.services.items():
        for key, value in environment(service).items():
            if SECRET_SETTING.search(key) and value not in generated:
                problems.append(
                    f"{service_name}: {key} is not one of the secrets in .env (a literal or a "
                    "default)"
                )
            for url in re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"']+", value):
                password = urlsplit(url).password
                if password is not None and password not in generated:
                    problems.append(
                        f"{service_name}: {key} holds a URL whose password is not one of the "
                        "secrets in .env"
                    )
    return problems


def shared_volume(deployment: Deployment) -> tuple[Mount | None, list[str]]:
    """The named volume that holds ``[dbspark] warehouse`` in the Airflow workers."""
    worker = deployment.service("airflow-worker")
    warehouse = environment(worker).get("AIRFLOW__DBSPARK__WAREHOUSE", "")
    for mount in mounts(worker):
        if mount.named and warehouse.startswith(mount.target.rstrip("/") + "/"):
            return mount, []
    return None, [f"no named volume of airflow-worker holds the warehouse {warehouse!r}"]


def check_volumes(deployment: Deployment) -> list[str]:
    problems = []
    declared = set(deployment.compose.get("volumes") or {})
    for name, service in deployment.services.items():
        for mount in mounts(service):
            if mount.named and mount.source not in declared:
                problems.append(f"{name} mounts volume {mount.source!r}, which is not declared")
    shared, found = shared_volume(deployment)
    problems += found
    if shared is None:
        return problems
    for name in SHARED_VOLUME_USERS:
        service = deployment.service(name)
        same = [m for m in mounts(service) if m.source == shared.source]
        if not same:
            problems.append(f"{name} does not mount the shared volume {shared.source}")
            continue
        if all(m.target != shared.target for m in same):
            problems.append(
                f"{name} mounts {shared.source} at {[m.target for m in same]}, not at "
                f"{shared.target} like airflow-worker: the driver, the executors and the "
                "tasks must name the same paths"
            )
        if any(m.read_only for m in same):
            problems.append(f"{name} mounts {shared.source} read-only")
        if name in AIRFLOW_SERVICES:
            env = environment(service)
            for key in ("WAREHOUSE", "LANDING", "OUTPUTS"):
                path = env.get(f"AIRFLOW__DBSPARK__{key}", "")
                if not path.startswith(shared.target.rstrip("/") + "/"):
                    problems.append(
                        f"{name}: AIRFLOW__DBSPARK__{key}={path!r} is not on the shared "
                        f"volume ({shared.target})"
                    )
    return problems


def check_images(deployment: Deployment) -> list[str]:
    problems = []
    minor = python_minor(deployment.requires_python)
    if minor is None:
        problems.append(f"requires-python {deployment.requires_python!r} allows no single minor")
    airflow_pin = deployment.lock.get("apache-airflow")
    pyspark_pin = deployment.lock.get("pyspark")
    if deployment.lock.get("pyspark-client") != pyspark_pin:
        problems.append("requirements.lock pins pyspark and pyspark-client to different versions")

    for name, service in deployment.services.items():
        image = image_of(service)
        if not image and not service.get("build"):
            problems.append(f"{name} has neither an image nor a build")
        if image and not is_pinned(image):
            problems.append(f"{name}: image {image!r} is not pinned to a version")
        dockerfile = dockerfile_of(service)
        if dockerfile is not None and dockerfile not in deployment.dockerfiles:
            problems.append(f"{name}: Dockerfile {dockerfile} does not exist")
    # One image per name: services sharing a tag must build it the same way.
    built: dict[str, str | None] = {}
    for service in deployment.services.values():
        image = image_of(service)
        if service.get("build") and image:
            dockerfile = dockerfile_of(service)
            if built.setdefault(image, dockerfile) != dockerfile:
                problems.append(f"image {image} is built from two Dockerfiles")

    def dockerfile_for(names: Iterable[str]) -> set[str | None]:
        return {dockerfile_of(deployment.service(n)) for n in names}

    # Airflow: the official image of the locked Airflow version and the project's Python.
    airflow_files = dockerfile_for(AIRFLOW_SERVICES)
    if len(airflow_files) != 1 or None in airflow_files:
        problems.append(
            f"the Airflow services must build one Dockerfile, they name {airflow_files}"
        )
    for path in airflow_files - {None}:
        instructions = deployment.dockerfiles.get(path or "", [])
        base = dockerfile_from(instructions) or ""
        match = re.fullmatch(r"apache/airflow:(\d+\.\d+\.\d+)-python(\d+\.\d+)", base)
        if not match:
            problems.append(f"{path}: base {base!r} is not apache/airflow:<version>-python<X.Y>")
        else:
            if match.group(1) != airflow_pin:
                problems.append(
                    f"{path}: base image is Airflow {match.group(1)}, requirements.lock pins "
                    f"apache-airflow=={airflow_pin}"
                )
            if match.group(2) != minor:
                problems.append(f"{path}: base image has Python {match.group(2)}, not {minor}")
        pip = [(user, cmd) for user, cmd in runs(instructions) if "pip install" in cmd]
        if not any(f"apache-airflow=={airflow_pin}" in cmd for _, cmd in pip):
            problems.append(f"{path}: pip install does not hold apache-airflow=={airflow_pin}")
        if any(user == "root" for user, _ in pip):
            problems.append(f"{path}: pip install runs as root; the base image wants USER airflow")

    # Spark: pinned Python of the project's minor version, the locked pyspark.
    spark_files = dockerfile_for(SPARK_SERVICES)
    if len(spark_files) != 1 or None in spark_files:
        problems.append(f"the Spark services must build one Dockerfile, they name {spark_files}")
    for path in spark_files - {None}:
        instructions = deployment.dockerfiles.get(path or "", [])
        base = dockerfile_from(instructions) or ""
        match = re.fullmatch(r"python:(\d+\.\d+)\.\d+-slim-bookworm", base)
        if not match:
            problems.append(f"{path}: base {base!r} is not a pinned python:X.Y.Z-slim-bookworm")
        elif match.group(1) != minor:
            problems.append(f"{path}: base image has Python {match.group(1)}, not {minor}")
        declared = dockerfile_args(instructions).get("PYSPARK_VERSION")
        if declared != pyspark_pin:
            problems.append(
                f"{path}: PYSPARK_VERSION is {declared!r}, requirements.lock pins "
                f"pyspark=={pyspark_pin}"
            )
        commands = " ".join(cmd for _, cmd in runs(instructions))
        if '"pyspark==${PYSPARK_VERSION}"' not in commands:
            problems.append(f"{path}: pip install does not name pyspark==${{PYSPARK_VERSION}}")
        if "check_pyspark.py" not in commands:
            problems.append(f"{path}: the build does not check pyspark against its jars")
        if not re.search(r"openjdk-(17|21)-jre", commands):
            problems.append(f"{path}: no Java 17 or 21 installed (Spark 4 needs one)")

    # The project wherever dbspark code or Spark executors run.
    for name, service in deployment.services.items():
        runs_dbspark = name in AIRFLOW_SERVICES or any(
            re.search(r"python3?\s+-m\s+dbspark\b", t) for t in texts_of(service)
        )
        if not runs_dbspark:
            continue
        path = dockerfile_of(service)
        if path is None or not installs_project(deployment.dockerfiles.get(path, [])):
            problems.append(
                f"{name} runs dbspark code, but its image does not install the project "
                "against requirements.lock"
            )
    return problems


def discover_dbspark_keys(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """``[dbspark]`` keys read anywhere in the code -> the files that read them."""
    keys: dict[str, list[str]] = {}
    for path, text in sources.items():
        for pattern in _DBSPARK_KEY_PATTERNS:
            for key in pattern.findall(text):
                keys.setdefault(key, []).append(path)
    return keys


def check_dbspark_settings(deployment: Deployment) -> list[str]:
    problems = []
    keys = discover_dbspark_keys(deployment.sources)
    missing_known = KNOWN_DBSPARK_KEYS - set(keys)
    if missing_known:
        problems.append(f"the scan of include/dbspark found no read of {sorted(missing_known)}")
    for name in AIRFLOW_SERVICES:
        env = environment(deployment.service(name))
        for key, readers in sorted(keys.items()):
            variable = f"AIRFLOW__DBSPARK__{key.upper()}"
            if key in OPTIONAL_DBSPARK_KEYS or env.get(variable):
                continue
            problems.append(
                f"{name}: {variable} is not set ([dbspark] {key} is read in "
                f"{', '.join(sorted(set(readers)))}); set it or declare it optional in "
                "OPTIONAL_DBSPARK_KEYS with a reason"
            )
        for variable in env:
            if variable.startswith("AIRFLOW__DBSPARK__"):
                key = variable.removeprefix("AIRFLOW__DBSPARK__").lower()
                if key not in keys:
                    problems.append(f"{name}: {variable} is set, but no code reads [dbspark] {key}")
    return problems


def check_connections(deployment: Deployment) -> list[str]:
    problems = []
    connect_services = {
        n: s
        for n, s in deployment.services.items()
        if any("dbspark.devtools.spark_connect" in t for t in texts_of(s))
    }
    for name in AIRFLOW_SERVICES:
        env = environment(deployment.service(name))
        spark_id = env.get("AIRFLOW__DBSPARK__SPARK_CONN_ID") or DEFAULT_SPARK_CONN_ID
        catalog_id = env.get("AIRFLOW__DBSPARK__CATALOG_CONN_ID") or DEFAULT_CATALOG_CONN_ID
        spark_var, catalog_var = (
            f"AIRFLOW_CONN_{spark_id.upper()}",
            f"AIRFLOW_CONN_{catalog_id.upper()}",
        )
        if not env.get(spark_var):
            problems.append(f"{name}: {spark_var} is not set (the Spark connection {spark_id!r})")
        else:
            try:
                conn = json.loads(env[spark_var])
            except ValueError as err:
                problems.append(f"{name}: {spark_var} is not JSON: {err}")
                conn = {}
            if conn and conn.get("conn_type") != "spark_connect":
                problems.append(
                    f"{name}: {spark_var} has conn_type {conn.get('conn_type')!r}, "
                    "not spark_connect"
                )
            host = conn.get("host")
            if conn and host not in connect_services:
                problems.append(
                    f"{name}: {spark_var} points at {host!r}, which is not the Spark Connect "
                    f"service ({sorted(connect_services)})"
                )
            elif conn:
                listening = option(command_tokens(connect_services[host]), "--port")
                if str(conn.get("port")) != str(listening):
                    problems.append(
                        f"{name}: {spark_var} port {conn.get('port')}, but {host} listens on "
                        f"{listening}"
                    )
        if not env.get(catalog_var):
            problems.append(f"{name}: {catalog_var} is not set (the catalog connection)")
        else:
            problems += check_database_url(deployment, env[catalog_var], f"{name}: {catalog_var}")
    return problems


def check_airflow_settings(deployment: Deployment) -> list[str]:
    """Executor, broker, result backend, metadata database, Execution API, secrets and
    login; the same in every Airflow service."""
    problems = []
    services = deployment.services
    reference = environment(deployment.service("airflow-scheduler"))
    api_port = option(command_tokens(deployment.service("airflow-apiserver")), "--port")
    for name in AIRFLOW_SERVICES:
        env = environment(deployment.service(name))
        where = name
        if env.get("AIRFLOW__CORE__EXECUTOR") != "CeleryExecutor":
            problems.append(f"{where}: AIRFLOW__CORE__EXECUTOR is not CeleryExecutor")
        broker = urlsplit(env.get("AIRFLOW__CELERY__BROKER_URL", ""))
        if broker.scheme != "redis" or not image_of(
            services.get(broker.hostname or "", {})
        ).startswith("redis:"):
            problems.append(
                f"{where}: the Celery broker {broker.geturl()!r} is not the redis service"
            )
        elif broker.port not in (None, 6379):
            problems.append(f"{where}: the Celery broker port {broker.port}, Redis listens on 6379")
        else:
            required = option(command_tokens(services[broker.hostname]), "--requirepass")
            if required is None:
                problems.append(f"{where}: Redis (the Celery broker) requires no password")
            elif broker.password != required:
                problems.append(
                    f"{where}: the Celery broker URL does not carry Redis's --requirepass"
                )
        backend = env.get("AIRFLOW__CELERY__RESULT_BACKEND", "")
        if not backend.startswith("db+"):
            problems.append(f"{where}: the Celery result backend is not a database (db+...)")
        else:
            problems += check_database_url(deployment, backend[3:], f"{where}: result backend")
        for key in (
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC",
        ):
            if key in env or key.endswith("_CONN"):
                problems += check_database_url(deployment, env.get(key, ""), f"{where}: {key}")
        execution = urlsplit(env.get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", ""))
        if execution.hostname != "airflow-apiserver" or str(execution.port) != str(api_port):
            problems.append(
                f"{where}: AIRFLOW__CORE__EXECUTION_API_SERVER_URL {execution.geturl()!r} is not "
                f"the api-server (airflow-apiserver:{api_port})"
            )
        elif not execution.path.rstrip("/").endswith("/execution"):
            problems.append(f"{where}: the Execution API URL does not end in /execution/")
        if len(env.get("AIRFLOW__API_AUTH__JWT_SECRET", "")) < 32:
            problems.append(f"{where}: AIRFLOW__API_AUTH__JWT_SECRET is unset or short")
        if not env.get("AIRFLOW__API__SECRET_KEY"):
            problems.append(f"{where}: AIRFLOW__API__SECRET_KEY is unset")
        try:
            Fernet(env.get("AIRFLOW__CORE__FERNET_KEY", ""))
        except ValueError:
            problems.append(f"{where}: AIRFLOW__CORE__FERNET_KEY is not a Fernet key")
        if env.get("AIRFLOW__CORE__LOAD_EXAMPLES", "").lower() != "false":
            problems.append(f"{where}: AIRFLOW__CORE__LOAD_EXAMPLES is not false")
        if env.get("AIRFLOW__CORE__AUTH_MANAGER") != SIMPLE_AUTH_MANAGER:
            problems.append(f"{where}: the auth manager is not SimpleAuthManager")
        for key in (
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        ):
            if not env.get(key):
                problems.append(f"{where}: {key} is unset")
        # "true" makes every visitor an admin without logging in (UI and REST API alike).
        all_admins = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"
        if env.get(all_admins, "").strip().lower() != "false":
            problems.append(f"{where}: {all_admins} is not false: everyone would be admin")
        for suffix in ("_CMD", "_SECRET"):  # Airflow reads these in its place
            if all_admins + suffix in env:
                problems.append(f"{where}: {all_admins}{suffix} is set")
        dags = env.get("AIRFLOW__CORE__DAGS_FOLDER", "/opt/airflow/dags")
        if not any(m.target == dags for m in mounts(deployment.service(name))):
            problems.append(f"{where}: nothing is mounted at the DAG folder {dags}")
        # One deployment: every component sees the same Airflow and dbspark settings.
        for key in sorted(set(env) | set(reference)):
            if key.startswith(("AIRFLOW__", "AIRFLOW_CONN_")) and env.get(key) != reference.get(
                key
            ):
                problems.append(f"{where}: {key} differs from airflow-scheduler's")
        for key, value in env.items():
            if key.startswith(("AIRFLOW__", "AIRFLOW_CONN_")) and re.search(
                r"\b(localhost|127\.0\.0\.1)\b", value
            ):
                problems.append(f"{where}: {key} names the local machine ({value!r})")
    # The login the api-server writes into the passwords file.
    api_env = environment(deployment.service("airflow-apiserver"))
    script = " ".join(texts_of(deployment.service("airflow-apiserver")))
    if "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" not in script:
        problems.append("airflow-apiserver does not write the passwords file before it starts")
    users = api_env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "")
    if users.split(":")[0] != api_env.get("DBSPARK_AIRFLOW_USER"):
        problems.append("airflow-apiserver: DBSPARK_AIRFLOW_USER is not the SimpleAuthManager user")
    if not api_env.get("DBSPARK_AIRFLOW_PASSWORD"):
        problems.append("airflow-apiserver: DBSPARK_AIRFLOW_PASSWORD is unset")
    return problems


def module_path(module: str) -> Path | None:
    base = INCLUDE.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def check_commands(deployment: Deployment) -> list[str]:
    """``python -m dbspark...`` names a module in include/ and only options it defines."""
    problems = []
    for name, service in deployment.services.items():
        tokens = command_tokens(service)
        for text in texts_of(service):
            for module in re.findall(r"python3?\s+-m\s+(dbspark[\w.]*)", text):
                path = module_path(module)
                if path is None:
                    problems.append(f"{name}: module {module} does not exist in include/")
                    continue
                source = deployment.sources.get(str(path.relative_to(REPO)), path.read_text())
                if "__main__" not in source:
                    problems.append(f"{name}: {module} cannot run as a program (no __main__)")
                for flag in {t.split("=", 1)[0] for t in tokens if t.startswith("--")}:
                    if f'"{flag}"' not in source:
                        problems.append(f"{name}: {module} defines no option {flag}")
    # The cluster: one master URL, and executors that fit in a worker.
    master = command_tokens(deployment.service("spark-master"))
    master_url = f"spark://spark-master:{option(master, '--port') or 7077}"
    worker = command_tokens(deployment.service("spark-worker"))
    connect = command_tokens(deployment.service("spark-connect"))
    for who, tokens in (("spark-worker", worker), ("spark-connect", connect)):
        if option(tokens, "--master") != master_url:
            problems.append(f"{who}: --master {option(tokens, '--master')!r}, not {master_url}")
    if option(worker, "--host") == "0.0.0.0":
        problems.append(
            "spark-worker advertises 0.0.0.0: executors would fetch each other's shuffle "
            "blocks from their own container"
        )
    conf = dict(c.split("=", 1) for c in options(connect, "--conf") if "=" in c)
    if conf.get("spark.driver.host") != "spark-connect":
        problems.append("spark-connect: spark.driver.host is not its service name")
    cores, memory = option(worker, "--cores"), size_bytes(option(worker, "--memory") or "")
    executor_cores = conf.get("spark.executor.cores", "1")
    executor_memory = size_bytes(conf.get("spark.executor.memory", "1g"))
    if not (cores and cores.isdigit() and executor_cores.isdigit()):
        problems.append(
            f"worker cores {cores!r} / executor cores {executor_cores!r} are not numbers"
        )
    elif int(executor_cores) > int(cores):
        problems.append(f"an executor wants {executor_cores} cores, a worker offers {cores}")
    if memory is None or executor_memory is None:
        problems.append("worker or executor memory is not a size")
    elif executor_memory > memory:
        problems.append("an executor wants more memory than a worker offers")
    return problems


def check_unit_worker(deployment: Deployment) -> list[str]:
    """Each Celery worker container runs the unit worker at ``[dbspark] worker_socket``,
    a path of its own (not on a volume), with the deployment's Spark Connect server."""
    problems = []
    service = deployment.service("airflow-worker")
    socket_path = environment(service).get("AIRFLOW__DBSPARK__WORKER_SOCKET")
    if not socket_path:
        return ["airflow-worker: AIRFLOW__DBSPARK__WORKER_SOCKET is not set"]
    script = " ".join(texts_of(service))
    started = re.search(
        r"(?:SPARK_REMOTE=(\S+)\s+)?python3?\s+-m\s+dbspark\.orchestration\.worker\s+"
        r"--socket\s+\"?\$\{?AIRFLOW__DBSPARK__WORKER_SOCKET",
        script,
    )
    if started is None:
        problems.append(
            "airflow-worker: its command starts no dbspark.orchestration.worker at "
            "$AIRFLOW__DBSPARK__WORKER_SOCKET"
        )
    else:
        conn = json.loads(environment(service).get("AIRFLOW_CONN_DBSPARK_SPARK") or "{}")
        expected = f"sc://{conn.get('host')}:{conn.get('port')}"
        if started.group(1) != expected:
            problems.append(
                f"airflow-worker: the unit worker's SPARK_REMOTE is {started.group(1)!r}, "
                f"not the tasks' Spark connection {expected}"
            )
    if "exec airflow celery worker" not in script:
        problems.append("airflow-worker: its command does not end in exec airflow celery worker")
    for mount in service.get("volumes") or []:
        target = str(mount).split(":")[1] if ":" in str(mount) else str(mount)
        if socket_path.startswith(target.rstrip("/") + "/"):
            problems.append(
                f"airflow-worker: the unit worker's socket {socket_path} is on the volume "
                f"{mount}, which other containers may share"
            )
    return problems


CHECKS: tuple[Check, ...] = (
    check_variables,
    check_services,
    check_dependencies,
    check_healthchecks,
    check_ports,
    check_published_addresses,
    check_secrets,
    check_spark_security,
    check_volumes,
    check_images,
    check_dbspark_settings,
    check_connections,
    check_airflow_settings,
    check_commands,
    check_unit_worker,
)


# ============================================================================ tests
@pytest.fixture(scope="module")
def deployment() -> Deployment:
    return load()


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_compose_file(deployment, check):
    problems = check(deployment)
    assert problems == [], "\n".join(problems)


def test_interpolation_follows_compose():
    interpolation = Interpolation({"SET": "x", "EMPTY": ""})
    assert (
        interpolation.string("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${EMPTY-d} $$HOME")
        == "x d d  $HOME"
    )
    assert interpolation.problems == []
    interpolation.string("${NO_DEFAULT}")
    assert interpolation.problems == [": ${NO_DEFAULT} has no default"]
    assert interpolation.string("${SET:?say so} ${UNSET:?say so}") == "x "
    assert interpolation.problems[-1] == ": ${UNSET} is required (say so)"


def test_merge_keys_are_resolved(deployment):
    """The anchors reach every Airflow service (a merge that silently dropped the
    environment would make every other check vacuous)."""
    for name in AIRFLOW_SERVICES:
        assert environment(deployment.service(name)).get("AIRFLOW__CORE__EXECUTOR"), name


def _mutated(deployment: Deployment, change: Callable[[Deployment], None]) -> Deployment:
    broken = copy.deepcopy(deployment)
    change(broken)
    return broken


def _env(d: Deployment, service: str) -> dict[str, Any]:
    return d.services[service]["environment"]


def _set_option(d: Deployment, service: str, flag: str, value: str) -> None:
    command = d.services[service]["command"]
    if isinstance(command, list) and flag in command:
        command[command.index(flag) + 1] = value
        return
    d.services[service]["command"] = [
        "sh",
        "-c",
        re.sub(rf'{flag} ("[^"]*"|\S+)', f"{flag} {value}", command[2]),
    ]


MUTATIONS: dict[str, tuple[Check, Callable[[Deployment], None], str]] = {
    "env.example out of date": (
        check_variables,
        lambda d: setattr(
            d,
            "env_example",
            d.env_example.replace("DBSPARK_SPARK_WORKER_CORES=2", "DBSPARK_SPARK_WORKER_CORES=4"),
        ),
        "deploy/env.example says '4'",
    ),
    "missing service": (
        check_services,
        lambda d: d.services.pop("airflow-triggerer"),
        "airflow-triggerer is missing",
    ),
    "dependency on an unknown service": (
        check_dependencies,
        lambda d: d.services["spark-connect"]["depends_on"].update(
            {"spark-mastr": {"condition": HEALTHY}}
        ),
        "spark-mastr, which is not a service",
    ),
    "worker does not wait for the master": (
        check_dependencies,
        lambda d: d.services["spark-worker"].pop("depends_on"),
        "spark-worker must wait for spark-master",
    ),
    "healthy dependency without a health check": (
        check_dependencies,
        lambda d: d.services["spark-master"].pop("healthcheck"),
        "it has no health check",
    ),
    "no health check": (
        check_healthchecks,
        lambda d: d.services["redis"].pop("healthcheck"),
        "redis has no health check",
    ),
    "port collision": (
        check_ports,
        lambda d: d.services["spark-connect"].update({"ports": ["8080:4040"]}),
        "host port 8080/tcp is published by both",
    ),
    "scaled service with a fixed port": (
        check_ports,
        lambda d: d.services["spark-worker"].update({"ports": ["8081:8081"]}),
        "spark-worker publishes ports",
    ),
    "scaled service with a container name": (
        check_ports,
        lambda d: d.services["airflow-worker"].update({"container_name": "worker"}),
        "airflow-worker has a container_name",
    ),
    "undeclared volume": (
        check_volumes,
        lambda d: d.compose["volumes"].pop("airflow-logs"),
        "'airflow-logs', which is not declared",
    ),
    "shared volume elsewhere": (
        check_volumes,
        lambda d: d.services["spark-worker"].update({"volumes": ["dbspark-data:/data"]}),
        "spark-worker mounts dbspark-data at ['/data']",
    ),
    "floating image tag": (
        check_images,
        lambda d: d.services["redis"].update({"image": "redis:latest"}),
        "'redis:latest' is not pinned",
    ),
    "Airflow base of another version": (
        check_images,
        lambda d: d.lock.update({"apache-airflow": "3.3.3"}),
        "requirements.lock pins apache-airflow==3.3.3",
    ),
    "Spark image of another pyspark": (
        check_images,
        lambda d: d.lock.update({"pyspark": "4.1.0", "pyspark-client": "4.1.0"}),
        "requirements.lock pins pyspark==4.1.0",
    ),
    "Python of another minor version": (
        check_images,
        lambda d: setattr(d, "requires_python", ">=3.12,<3.13"),
        "Python 3.11, not 3.12",
    ),
    "unset [dbspark] key": (
        check_dbspark_settings,
        lambda d: _env(d, "airflow-worker").pop("AIRFLOW__DBSPARK__LANDING"),
        "airflow-worker: AIRFLOW__DBSPARK__LANDING is not set",
    ),
    "a new [dbspark] key in the code": (
        check_dbspark_settings,
        lambda d: d.sources.update({"new.py": 'conf.get("dbspark", "checkpoints", fallback=None)'}),
        "AIRFLOW__DBSPARK__CHECKPOINTS is not set",
    ),
    "a new dbspark_setting key in the code": (
        check_dbspark_settings,
        lambda d: d.sources.update({"new.py": 'x = dbspark_setting("retention")'}),
        "AIRFLOW__DBSPARK__RETENTION is not set",
    ),
    "no Spark connection": (
        check_connections,
        lambda d: _env(d, "airflow-worker").pop("AIRFLOW_CONN_DBSPARK_SPARK"),
        "airflow-worker: AIRFLOW_CONN_DBSPARK_SPARK is not set",
    ),
    "Spark connection at the wrong port": (
        check_connections,
        lambda d: _env(d, "airflow-worker").update(
            {
                "AIRFLOW_CONN_DBSPARK_SPARK": json.dumps(
                    {"conn_type": "spark_connect", "host": "spark-connect", "port": 15003}
                )
            }
        ),
        "port 15003, but spark-connect listens on 15002",
    ),
    "Spark connection of another type": (
        check_connections,
        lambda d: _env(d, "airflow-worker").update(
            {"AIRFLOW_CONN_DBSPARK_SPARK": '{"conn_type": "spark", "host": "spark-connect"}'}
        ),
        "not spark_connect",
    ),
    "catalog in a database nobody creates": (
        check_connections,
        lambda d: _env(d, "airflow-worker").update(
            {"AIRFLOW_CONN_DBSPARK_CATALOG": "postgres://dbspark:dbspark@postgres:5432/catalog"}
        ),
        "database 'catalog' is not created by the init script",
    ),
    "catalog with the wrong password": (
        check_connections,
        lambda d: _env(d, "postgres").update({"DBSPARK_CATALOG_DB_PASSWORD": "other"}),
        "the password differs from DBSPARK_CATALOG_DB_PASSWORD",
    ),
    "broker that is not a service": (
        check_airflow_settings,
        lambda d: _env(d, "airflow-worker").update(
            {"AIRFLOW__CELERY__BROKER_URL": "redis://broker:6379/0"}
        ),
        "is not the redis service",
    ),
    "broker without its password": (
        check_airflow_settings,
        lambda d: _env(d, "airflow-worker").update(
            {"AIRFLOW__CELERY__BROKER_URL": "redis://redis:6379/0"}
        ),
        "does not carry Redis's --requirepass",
    ),
    "broker that requires no password": (
        check_airflow_settings,
        lambda d: d.services["redis"].pop("command"),
        "Redis (the Celery broker) requires no password",
    ),
    "result backend in another database": (
        check_airflow_settings,
        lambda d: _env(d, "airflow-scheduler").update(
            {"AIRFLOW__CELERY__RESULT_BACKEND": "db+postgresql+psycopg://airflow:airflow@redis/x"}
        ),
        "host 'redis' is not a PostgreSQL service",
    ),
    "metadata database on psycopg2": (
        check_airflow_settings,
        lambda d: _env(d, "airflow-worker").update(
            {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _env(d, "airflow-worker")[
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
                ].replace("+psycopg", "+psycopg2")
            }
        ),
        "driver 'postgresql+psycopg2'",
    ),
    "one-shot init that restarts": (
        check_dependencies,
        lambda d: d.services["airflow-init"].update({"restart": "always"}),
        "waits for airflow-init to complete, but airflow-init restarts",
    ),
    "everyone an admin without logging in": (
        check_airflow_settings,
        lambda d: [
            _env(d, n).update({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "true"})
            for n in AIRFLOW_SERVICES
        ],
        "airflow-apiserver: AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS is not false",
    ),
    "everyone an admin by a command": (
        check_airflow_settings,
        lambda d: [
            _env(d, n).update({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS_CMD": "echo true"})
            for n in AIRFLOW_SERVICES
        ],
        "airflow-apiserver: AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS_CMD is set",
    ),
    "a worker with its own JWT secret": (
        check_airflow_settings,
        lambda d: _env(d, "airflow-worker").update({"AIRFLOW__API_AUTH__JWT_SECRET": "x" * 40}),
        "airflow-worker: AIRFLOW__API_AUTH__JWT_SECRET differs",
    ),
    "a setting that assumes one machine": (
        check_airflow_settings,
        lambda d: [
            _env(d, n).update(
                {"AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://localhost:8080/execution/"}
            )
            for n in AIRFLOW_SERVICES
        ],
        "names the local machine",
    ),
    "a module that does not exist": (
        check_commands,
        lambda d: d.services["spark-master"].update(
            {"command": ["python", "-m", "dbspark.engine.spark.standalon", "master"]}
        ),
        "module dbspark.engine.spark.standalon does not exist",
    ),
    "an option the module does not define": (
        check_commands,
        lambda d: d.services["spark-connect"]["command"].extend(["--driver-memory", "4g"]),
        "defines no option --driver-memory",
    ),
    "executors bigger than a worker": (
        check_commands,
        lambda d: _set_option(d, "spark-worker", "--memory", "512m"),
        "more memory than a worker offers",
    ),
    "a literal secret": (
        check_secrets,
        lambda d: [
            _env(d, n).update({"AIRFLOW__API_AUTH__JWT_SECRET": "insecure-default-" * 4})
            for n in AIRFLOW_SERVICES
        ],
        "airflow-worker: AIRFLOW__API_AUTH__JWT_SECRET is not one of the secrets in .env",
    ),
    "a literal database password in a URL": (
        check_secrets,
        lambda d: _env(d, "airflow-worker").update(
            {"AIRFLOW_CONN_DBSPARK_CATALOG": "postgres://dbspark:dbspark@postgres:5432/x"}
        ),
        "AIRFLOW_CONN_DBSPARK_CATALOG holds a URL whose password is not one of the secrets",
    ),
    "a port on every interface": (
        check_published_addresses,
        lambda d: d.services["airflow-apiserver"].update({"ports": ["8080:8080"]}),
        "airflow-apiserver publishes port 8080 on every interface",
    ),
    "a Spark port published": (
        check_published_addresses,
        lambda d: d.services["spark-connect"].update({"ports": ["0.0.0.0:15002:15002"]}),
        "spark-connect publishes port 15002 on every interface",
    ),
    "a Spark UI published, even on loopback": (
        check_spark_security,
        lambda d: d.services["spark-master"].update({"ports": ["127.0.0.1:8090:8080"]}),
        "spark-master publishes ['127.0.0.1:8090:8080']",
    ),
    "a Spark worker without the secret": (
        check_spark_security,
        lambda d: _env(d, "spark-worker").pop("DBSPARK_SPARK_AUTH_SECRET"),
        "spark-worker: DBSPARK_SPARK_AUTH_SECRET is not set",
    ),
    "a Spark daemon without authentication": (
        check_spark_security,
        lambda d: d.services["spark-master"]["command"].append("--no-auth"),
        "spark-master runs with --no-auth",
    ),
    "no unit worker beside Celery": (
        check_unit_worker,
        lambda d: d.services["airflow-worker"].update({"command": "celery worker"}),
        "starts no dbspark.orchestration.worker",
    ),
    "a unit worker with another Spark": (
        check_unit_worker,
        lambda d: d.services["airflow-worker"].update(
            {
                "command": [
                    "bash",
                    "-c",
                    d.services["airflow-worker"]["command"][2].replace(
                        "sc://spark-connect:15002", "sc://localhost:15002"
                    ),
                ]
            }
        ),
        "SPARK_REMOTE is 'sc://localhost:15002'",
    ),
    "worker advertising 0.0.0.0": (
        check_commands,
        lambda d: _set_option(d, "spark-worker", "--host", "0.0.0.0"),
        "spark-worker advertises 0.0.0.0",
    ),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_a_broken_file_is_reported(deployment, case):
    check, change, expected = MUTATIONS[case]
    assert check(deployment) == [], "the real file must pass before a mutation means anything"
    problems = check(_mutated(deployment, change))
    assert any(expected in p for p in problems), problems


def test_variables_without_defaults_are_reported(deployment):
    broken = copy.deepcopy(deployment.raw_compose)
    broken["services"]["redis"]["image"] = "redis:${REDIS_TAG}"
    interpolation = Interpolation()
    interpolation.resolve(broken)
    assert "${REDIS_TAG} has no default" in " ".join(interpolation.problems)


def test_discovery_sees_the_code_as_it_is(deployment):
    keys = discover_dbspark_keys(deployment.sources)
    assert set(keys) >= KNOWN_DBSPARK_KEYS
    assert set(OPTIONAL_DBSPARK_KEYS) <= set(keys), "an optional key nobody reads: remove it"


# ============================================================================ security
def test_without_a_dot_env_compose_refuses_to_start_naming_every_secret():
    """No secret has a default: with an empty environment every one of them is an
    interpolation error (``docker compose`` stops with the message), and nothing else is."""
    problems = load(env={}).interpolation.problems
    required = {re.search(r"\$\{(\w+)\} is required", p).group(1) for p in problems}
    assert required == set(SECRETS), problems
    assert all("bin/make-env" in p for p in problems), problems


def test_nothing_is_published_beyond_loopback_unless_asked(deployment):
    published = [(n, p) for n, s in deployment.services.items() for p in ports(s)]
    assert published, "the Airflow UI must stay reachable on the host"
    assert {p.ip for _, p in published} == {"127.0.0.1"}, published
    # DBSPARK_BIND_ADDRESS asks for another address, and only then is one used.
    everywhere = load(env={**GENERATED_SECRETS, "DBSPARK_BIND_ADDRESS": "0.0.0.0"})
    assert check_published_addresses(everywhere) != []
    assert {p.ip for s in everywhere.services.values() for p in ports(s)} == {"0.0.0.0"}


def _with_text(change: Callable[[str], str]) -> Deployment:
    text = change(COMPOSE.read_text())
    assert text != COMPOSE.read_text(), "the mutation did not apply"
    return load(text=text)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda text: re.sub(
                r"\$\{DBSPARK_JWT_SECRET:\?[^}]*\}",
                "${DBSPARK_JWT_SECRET:-insecure-default-0123456789abcdef0123456789abcdef}",
                text,
            ),
            "${DBSPARK_JWT_SECRET} is a secret, so it must be ${DBSPARK_JWT_SECRET:?message}",
        ),
        (
            lambda text: re.sub(
                r"redis://:\$\{DBSPARK_REDIS_PASSWORD:\?[^}]*\}@",
                "redis://:${DBSPARK_BROKER_PASSWORD:-redis}@",
                text,
            ),
            "${DBSPARK_BROKER_PASSWORD} looks like a secret, but bin/make-env does not make it",
        ),
    ],
    ids=["a secret with a default", "a new secret with a default"],
)
def test_a_default_secret_in_the_file_is_reported(change, expected):
    problems = check_secrets(_with_text(change))
    assert any(expected in p for p in problems), problems


def test_make_env_writes_a_private_file_it_will_not_replace(tmp_path):
    from dbspark.devtools.env_file import EnvFileExists, write_env

    path = tmp_path / ".env"
    values = write_env(path)
    assert set(values) == set(SECRETS)
    assert path.stat().st_mode & 0o777 == 0o600
    written = dict(
        line.split("=", 1) for line in path.read_text().splitlines() if not line.startswith("#")
    )
    assert written == values
    Fernet(values["DBSPARK_FERNET_KEY"])  # the format Airflow wants
    # The deployment checks pass with what it wrote.
    deployment = load(env=written)
    assert check_secrets(deployment) == [] and deployment.interpolation.problems == []
    with pytest.raises(EnvFileExists, match="--force"):
        write_env(path)
    assert (
        dict(
            line.split("=", 1) for line in path.read_text().splitlines() if not line.startswith("#")
        )
        == values
    ), "the existing file was changed"
    again = write_env(path, force=True)
    assert again != values and path.stat().st_mode & 0o777 == 0o600
