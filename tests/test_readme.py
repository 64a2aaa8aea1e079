"""The README as a newcomer reads it: its tour, run as written against the real server.

The tour's shell blocks are taken from README.md and run in order, each command in
``bash`` as a user would type it in their second terminal: in a checkout whose
``.venv`` is this test's environment, with a fresh ``HOME`` (so the default data
directory ``~/.local/share/lmsp`` is a temporary one), ``lmsp`` not on ``PATH`` until
the tour puts it there, and the bundled model. The test plays the other terminal:
``make serve`` (``lmsp serve``), then Ctrl-\\ while the background task streams, and
``make serve`` again. What a user reads off an earlier answer and types into a later
command is filled in the same way: the ``resp_…`` and ``TASK_ID`` placeholders and the
last ``sequence_number`` printed. Only the port differs (the test's server listens on a
free one, not 8430). The test fails when a command of the tour stops working, answers
an error, or when the "long" background task ends before it can be killed.

The tour's Python block (the OpenAI SDK) runs too, and every ``lmsp`` line of the CLI
section must parse against the command tree.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click
import httpx
import pytest

import lmsp
from lmsp.cli import main
from tests.helpers import Server, free_port
from tests.hub_standin import Hub, HubFile, serve, sha256_of, variant_gguf

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parent.parent / "README.md"
VENV_BIN = Path(sys.executable).parent
#: text deltas to see streaming before the server is killed under the task: a user
#: needs seconds to switch terminals, so a "long" task that ends sooner fails the test
#: (the old counting prompt ended after 3-22 tokens); ~2 s at this model's speed
DELTAS_BEFORE_THE_KILL = 150
#: events to see after the resume before the test stops watching, as a user would
DELTAS_AFTER_THE_RESUME = 10


# -- reading the README -----------------------------------------------------------------


def section(title: str, doc: Path = README) -> str:
    """The text of the section of ``doc`` (the README) whose heading starts with
    ``title``."""
    text = doc.read_text()
    start = re.search(rf"^## {re.escape(title)}.*$", text, flags=re.MULTILINE)
    assert start, f"{doc.name} has no section {title!r}"
    end = re.search(r"^## ", text[start.end() :], flags=re.MULTILINE)
    return text[start.end() : start.end() + end.start() if end else len(text)]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[str]:
    """A shell block's commands: a command runs on while a quote is open or a line ends
    with a backslash; comment lines go (bash skips a trailing comment by itself)."""
    found: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote or a trailing backslash: the command goes on
            continue
        found.append(pending)
        pending = ""
    assert not pending, f"unfinished command in the README: {pending!r}"
    return found


# -- playing the user --------------------------------------------------------------------


@dataclass
class User:
    """The newcomer's second terminal: what the tour set (exports, the venv) carries
    from one command to the next, and what they read off the answers."""

    checkout: Path
    env: dict[str, str]
    port: int
    state: list[str] = field(default_factory=list)
    first_response: str | None = None  # the first answer's id (a conversation goes on)
    job: dict[str, Any] | None = None  # the background task: response and task ids
    last_sequence: int = -1
    transcript: list[str] = field(default_factory=list)

    def fill(self, command: str) -> str:
        """The command as the user types it: this server's port, and what they read off
        the earlier answers in place of the README's placeholders."""
        command = command.replace("localhost:8430", f"localhost:{self.port}")
        command = command.replace("127.0.0.1:8430", f"127.0.0.1:{self.port}")
        if '"previous_response_id": "resp_…"' in command:
            assert self.first_response, "no answer to continue"
            command = command.replace("resp_…", self.first_response)
        if "resp_…" in command or "TASK_ID" in command:
            assert self.job, f"the README names a task before it made one: {command}"
            command = command.replace("resp_…", self.job["id"])
            command = command.replace("TASK_ID", self.job["task"]["id"])
        command = re.sub(r"starting_after=\d+", f"starting_after={self.last_sequence}", command)
        return command

    def script(self, command: str) -> str:
        return "set -e\n" + "\n".join(self.state) + "\n" + command

    def popen(
        self, command: str, typed: str | None = None, shown: str | None = None
    ) -> subprocess.Popen[str]:
        """``command`` in the shell as the tour left it; ``typed``: what the user
        types into it (its standard input), else nothing."""
        self.transcript.append(f"$ {shown or command}")
        return subprocess.Popen(
            ["bash", "-c", self.script(command)],
            cwd=self.checkout,
            env=self.env,
            stdin=subprocess.DEVNULL if typed is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def run(self, command: str, timeout: float = 600, typed: str | None = None) -> str:
        """Run ``command`` as typed in the one shell: what it exports or assigns stays
        set for the next commands, evaluated once (a ``$(lmsp clients add …)`` makes one
        client, not one for every later command)."""
        began = time.monotonic()
        names = assigned(command)
        values = self.checkout.parent / "shell-values"
        keep = "".join(f' "${{{name}-}}"' for name in names)
        script = f"{command}\nprintf '%s\\0'{keep} > {values}" if names else command
        done = self.popen(script, typed, shown=command)
        try:
            out, err = done.communicate(typed, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(done.pid, signal.SIGKILL)
            done.communicate()
            raise AssertionError(f"{command!r} did not finish in {timeout:.0f} s") from None
        self.transcript.append(f"{out}{err}[{time.monotonic() - began:.1f} s]")
        assert done.returncode == 0, f"{command!r} exited {done.returncode}: {err or out}"
        answered_well(command, out)
        if re.match(r"^(\. |source )", command):
            self.state.append(command)
        exported = "export " if command.startswith("export ") else ""
        for name, value in zip(
            names, values.read_text().split("\0") if names else [], strict=False
        ):
            self.state.append(f"{exported}{name}={shlex.quote(value)}")
        return out

    def remember(self, out: str) -> None:
        """The ids an answer shows: the first response's, a background task's."""
        for obj in json_objects(out):
            if obj.get("object") == "response":
                if obj.get("background"):
                    self.job = self.job or obj
                elif self.first_response is None:
                    self.first_response = obj["id"]


def assigned(command: str) -> list[str]:
    """The shell variables a command sets for the commands after it (``export A=…
    B=…``, ``A=1``, ``TOKEN=$(…)``); none for a command given a variable of its own
    (``A=1 cmd``)."""
    words = shlex.split(command, comments=True)
    exported = words[:1] == ["export"]
    names: list[str] = []
    for word in words[1:] if exported else words:
        found = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=", word)
        if found is None:
            break
        names.append(found.group(1))
    if exported or len(names) == len(words):
        return names
    substituted = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\$\(.*\)", command.strip(), re.DOTALL)
    return names[:1] if substituted else []  # `TOKEN=$(…)`: its words are the command's


def json_objects(out: str) -> list[dict[str, Any]]:
    found = []
    for part in re.split(r"\r?\n\r?\n", out):  # an HTTP head (curl -i), then the body
        try:
            obj = json.loads(part)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def answered_well(command: str, out: str) -> None:
    """An answer a user would take for a failure fails the test: a non-2xx status
    (curl -i) or an error body."""
    status = re.match(r"HTTP/[\d.]+ (\d{3})", out)
    assert status is None or status.group(1).startswith("2"), f"{command!r}: {out[:500]}"
    for obj in json_objects(out):
        assert not obj.get("error"), f"{command!r} answered an error: {obj['error']}"


def events(lines: IO[str], until: Any) -> Iterator[dict[str, Any]]:
    """The ``data:`` events of an SSE stream as they come, until ``until(event)``."""
    for line in lines:
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[len("data: ") :])
        yield event
        if until(event):
            return


def _no_core_file() -> None:
    """SIGQUIT dumps core where that is on: not a server's worth of memory, not here."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class Service(Server):
    """The first terminal: ``make serve`` (``lmsp serve`` of the checkout's venv) in the
    newcomer's environment, on the default data directory of their ``HOME``."""

    def __init__(self, env: dict[str, str], data_dir: Path) -> None:
        super().__init__(data_dir, env)
        self.port = int(env["LMSP_PORT"])

    def launch(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "lmsp"), "serve"],
                env=self.extra_env,
                cwd=self.log_path.parent,
                stdout=out,
                stderr=out,
                preexec_fn=_no_core_file,
            )
        return self.proc

    def quit(self) -> None:
        """Ctrl-\\ in its terminal: SIGQUIT, no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGQUIT)
        self.proc.wait(60)


def first_hour(tmp_path: Path, blob_cache: Path) -> tuple[User, Path]:
    """A newcomer's second terminal, in a checkout whose ``.venv`` is this test's
    environment, with a fresh ``HOME`` whose default data directory holds the bundled
    model (linked); and that data directory, for the first terminal's server."""
    home = tmp_path / "home"
    data_dir = home / ".local" / "share" / "lmsp"
    (data_dir / "blobs").mkdir(parents=True)
    for blob in blob_cache.iterdir():  # the bundled model, linked rather than copied
        os.link(blob, data_dir / "blobs" / blob.name)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    venv = VENV_BIN.parent
    assert (venv / "bin" / "activate").exists(), "the tests must run in a virtual env"
    (checkout / ".venv").symlink_to(venv)
    (checkout / "notes.md").write_text(
        "# Notes\n\n- The meeting moved to Thursday at ten.\n- Bring the budget figures.\n"
    )
    port = free_port()
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LMSP_") and k not in ("VIRTUAL_ENV", "XDG_DATA_HOME")
    }
    env.update({"HOME": str(home), "PATH": path, "LMSP_PORT": str(port)})
    return User(checkout, env, port), data_dir


@pytest.fixture
def newcomer(tmp_path: Path, blob_cache: Path) -> Iterator[tuple[User, Service]]:
    user, data_dir = first_hour(tmp_path, blob_cache)
    # the tour's `lmsp pull` reads a stand-in for the hub on loopback (nothing downloads
    # a model in the tests): the repository it names, serving the bundled model changed
    # by one byte under that repository's file name
    hub = tour_hub(tmp_path)
    service = Service({**user.env, "LMSP_HF_ENDPOINT": hub.url}, data_dir)
    yield user, service
    service.stop()
    hub.close()


def tour_hub(tmp_path: Path) -> Hub:
    from lmsp.bootstrap import bundled_model_path

    pulled = re.search(r"^lmsp pull hf\.co/([^:\s]+):(\S+)", section("A 60-second tour"), re.M)
    assert pulled, "the tour pulls a model"
    repo, quant = pulled.groups()
    name = f"{repo.split('/')[1].removesuffix('-GGUF').lower()}-{quant.lower()}.gguf"
    file = variant_gguf(bundled_model_path(), tmp_path / name)
    return serve(Hub(repo, [HubFile(name, file, file.stat().st_size, sha256_of(file))]))


def test_the_tour_works_as_written(newcomer: tuple[User, Service]) -> None:
    user, service = newcomer
    tour = section("A 60-second tour")
    service.start()  # `make serve`
    banner = service.log_path.read_text()
    assert f"on {service.url}, data in {user.env['HOME']}/.local/share/lmsp" in banner
    assert f"the lmsp command is {VENV_BIN / 'lmsp'}" in banner  # it is not on PATH
    try:
        walk(user, service, [c for block in blocks(tour, "sh") for c in commands(block)])
        # the SDK snippets too; Claude Code's shell block needs `claude`, not installed here
        sdks = section("From Anthropic's SDK and Claude Code")
        for block in blocks(tour, "python") + blocks(sdks, "python"):
            script = user.checkout / "tour.py"
            script.write_text(user.fill(block))
            out = user.run("python tour.py")
            assert out.strip(), "the SDK example printed nothing"
    except AssertionError:
        print(service.log_path.read_text()[-4000:])
        raise
    finally:
        print("\n".join(user.transcript))


def walk(user: User, service: Service, tour: list[str]) -> None:
    """Every command of the tour in order; the streams are watched as a user would."""
    for command in tour:
        typed = user.fill(command)
        if "?stream=true" in typed and "starting_after" not in typed:
            kill_under_the_stream(user, service, typed)
        elif "starting_after" in typed:
            watch_the_resume(user, typed)
        else:
            user.remember(user.run(typed))
    assert user.job is not None, "the tour made no background task"


def kill_under_the_stream(user: User, service: Service, command: str) -> None:
    """Follow the background task; after some text, Ctrl-\\ the server; curl ends with
    the connection. The task must still be generating when the server dies."""
    assert user.job is not None
    stream = user.popen(command)
    assert stream.stdout is not None
    deltas = 0
    for event in events(stream.stdout, lambda e: False):
        user.last_sequence = event["sequence_number"]
        assert event["type"] not in (
            "response.completed",
            "response.incomplete",
            "response.failed",
            "response.cancelled",
        ), f"the background task ended after {deltas} deltas, before it could be killed"
        deltas += event["type"] == "response.output_text.delta"
        if deltas >= DELTAS_BEFORE_THE_KILL:
            break
    assert deltas >= DELTAS_BEFORE_THE_KILL, "the stream ended before the kill"
    user.transcript.append(f"[{deltas} deltas, last sequence_number {user.last_sequence}: Ctrl-\\]")
    service.quit()
    stream.wait(60)  # a plain HTTP client does not reconnect: curl stops
    with pytest.raises(httpx.ConnectError):  # the server is gone
        httpx.get(f"{service.url}/healthz")
    service.start()  # `make serve` again


def watch_the_resume(user: User, command: str) -> None:
    """The events after the last one curl printed: the task resumed (no reset) and the
    numbers go on from the next one; then stop watching (Ctrl-C), the task goes on."""
    after = user.last_sequence
    stream = user.popen(command)
    assert stream.stdout is not None
    seen: list[dict[str, Any]] = []
    deltas = 0
    for event in events(stream.stdout, lambda e: e["type"] == "response.completed"):
        seen.append(event)
        deltas += event["type"] == "response.output_text.delta"
        if deltas >= DELTAS_AFTER_THE_RESUME or event["type"].endswith(("failed", "cancelled")):
            break
    os.killpg(stream.pid, signal.SIGINT)
    stream.wait(30)
    user.transcript.append(f"[{len(seen)} events after the resume: Ctrl-C]")
    numbers = [e["sequence_number"] for e in seen]
    assert numbers and numbers[0] == after + 1, (after, numbers[:5])
    assert numbers == sorted(set(numbers)), numbers
    kinds = [e["type"] for e in seen]
    assert "response.in_progress" in kinds, kinds
    resumed = seen[kinds.index("response.in_progress")]
    assert resumed.get("resumed") is True and not resumed.get("reset"), resumed
    assert not {"response.failed", "response.cancelled"} & set(kinds), kinds


def test_every_cli_line_of_the_readme_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI section's examples name commands and options that exist, with values
    that parse (``[…]`` marks what is optional; the files they name are made)."""
    monkeypatch.chdir(tmp_path)
    checked = 0
    for block in blocks(section("CLI"), "sh"):
        for command in commands(block):
            argv = shlex.split(command, comments=True)
            assert argv[0] == "lmsp", command
            args = [a for a in argv[1:] if not (a.startswith("[") or a.endswith("]"))]
            for named in (a for a in args if a.startswith("./")):
                (tmp_path / named).touch()
            ctx = click.Context(main, info_name="lmsp")
            leaf: click.Command = main
            name = "lmsp"
            while isinstance(leaf, click.Group):
                if not args and leaf.invoke_without_command:  # `lmsp models` lists them
                    break
                assert args, f"{command}: names a group, not a command"
                name, *args = args
                found = leaf.get_command(ctx, name)
                assert found is not None, f"{command}: no command {name!r}"
                ctx = click.Context(found, info_name=name, parent=ctx)
                leaf = found
            try:
                leaf.make_context(name, args, parent=ctx.parent)
            except click.UsageError as exc:
                raise AssertionError(f"{command}: {exc.format_message()}") from None
            checked += 1
    assert checked >= 15


#: settings read from the environment that are not the service's configuration
NOT_SERVICE_SETTINGS = {
    "LMSP_URL": "the CLI's and lmsp.Client's service address (the CLI section)",
    "LMSP_TOKEN": "the CLI's and lmsp.Client's token (the CLI section)",
    "LMSP_ENABLE_TEST_ENGINE": "the test suite's deterministic engine",
    "LMSP_TEST_ENGINE_DELAY": "the test suite's deterministic engine",
    "LMSP_TEST_ENGINE_LENGTH": "the test suite's deterministic engine",
}


def test_every_setting_is_in_the_configuration_table() -> None:
    source = Path(lmsp.__file__).parent
    read = {  # every quoted LMSP_* name in the code: what it reads from the environment
        name
        for path in source.rglob("*.py")
        for name in re.findall(r"""["'](LMSP_[A-Z_]+)["']""", path.read_text())
    }
    table = set(re.findall(r"^\| `(LMSP_[A-Z_]+)` \|", section("Configuration"), re.MULTILINE))
    assert "LMSP_GC_INTERVAL" in read and "LMSP_THREADS" in read  # the scan finds them
    assert read - set(NOT_SERVICE_SETTINGS) - table == set(), "settings missing from README"
    assert table - read == set(), "README lists settings nothing reads"
    for name in ("LMSP_URL", "LMSP_TOKEN"):
        assert name in section("CLI")


def test_the_configuration_table_is_the_declarations() -> None:
    """Each row of the README's settings table is its setting's declaration in
    lmsp.config (variable, flag, default, meaning), and every declared setting the
    README documents has its row, once."""
    from lmsp.config import declarations

    rows = re.findall(r"^\| `LMSP_.*\|$", section("Configuration"), re.MULTILINE)
    table = {row.split("`")[1]: row for row in rows}
    assert len(table) == len(rows), "a setting in the README's table twice"
    declared = {d.env: d.row() for d in declarations() if d.documented}
    wrong = {env: row for env, row in declared.items() if table.get(env) != row}
    assert not wrong, "README rows that differ from lmsp.config's declarations:\n" + "\n".join(
        wrong.values()
    )
    assert set(table) == set(declared), "README rows that no declaration has"


def test_no_snippet_hard_codes_the_data_directory() -> None:
    """The tour exports ``LMSP_DATA_DIR``; a snippet that reads the owner token from the
    default place would read another service's token (or none)."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    readers = [s for s in snippets if "owner.token" in s]
    assert readers, "the README's SDK snippets read the owner token"
    for snippet in readers:
        assert "LMSP_DATA_DIR" in snippet, snippet
        assert "local/share/lmsp/owner.token" not in snippet, snippet
