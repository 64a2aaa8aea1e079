"""One voice for the whole ``lmsp`` command, checked on click's command tree (so a new
command is checked without anyone adding it here):

- every error is one line on stderr, ``Error: <message> (<code>)``: a command line
  click cannot parse, a service that does not answer, a refused or missing token, an
  unknown id, a cancelled task followed;
- every option says what it is, the same words for the same option on every command,
  and no command's summary is cut short in its group's listing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import lmsp.cli
from lmsp.cli import main
from lmsp.cli.common import DATA_DIR_HELP, JSON_HELP, TOKEN_HELP, URL_HELP
from tests.helpers import Server, free_port, seeded_data_dir

ERROR_LINE = re.compile(r"^Error: (?P<message>\S.*) \((?P<code>[a-z][a-z0-9_]*)\)$")

#: options whose meaning differs from one command to the next, and why
MEANS_ANOTHER_THING = {
    # `pair approve` grants a subset of what was asked; `clients add` names them all
    "--scopes",
    # `run`'s is this request's; `models set`'s is a model's default for later ones
    "--temperature",
    # `tasks follow` starts after an event's sequence number; `audit` after a row's id
    "--after",
}


def children(group: click.Group) -> dict[str, click.Command]:
    """A group's commands as click lists them: ``lmsp``'s own are added only when they
    are listed or named (:class:`lmsp.cli.errors.Lazy`), so ``group.commands`` alone
    would hold ``serve`` and ``gc`` and nothing else."""
    ctx = click.Context(group)
    found = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def commands(
    group: click.Group = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group`` with its path of names, groups included."""
    for name, command in sorted(children(group).items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def leaves() -> list[tuple[tuple[str, ...], click.Command]]:
    return [(path, c) for path, c in commands() if not isinstance(c, click.Group)]


def remote(command: click.Command) -> bool:
    """A command that talks to the running service (it takes ``--url``)."""
    return any(isinstance(p, click.Option) and "--url" in p.opts for p in command.params)


def one_error(result: Result, code: str | None = None) -> re.Match[str]:
    """The result is a non-zero exit whose stderr is exactly one error line."""
    assert result.exit_code not in (0, None), result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    found = ERROR_LINE.match(lines[0])
    assert found, lines[0]
    if code is not None:
        assert found["code"] == code, lines[0]
    return found


def filled(command: click.Command, model_file: Path) -> list[str]:
    """Arguments (required ones, and a file an optional one names: ``models add``'s PATH,
    optional beside ``--remote``) and required options with values that parse (what they
    name need not exist), and what a command needs beyond them to reach the service."""
    args: list[str] = []
    for param in command.params:
        if isinstance(param, click.Argument) and (
            param.required or isinstance(param.type, click.Path)
        ):
            args.append(str(model_file) if isinstance(param.type, click.Path) else "x_1")
        elif isinstance(param, click.Option) and param.required:
            args += [param.opts[-1], "responses:read" if param.name == "scopes" else "x"]
    if any(isinstance(p, click.Option) and "--unset" in p.opts for p in command.params):
        args += ["--unset", "temperature"]  # `models set` must be asked to change something
    return args


def invoke(*args: str, **env: str | None) -> Result:
    environment: dict[str, str | None] = {"LMSP_TOKEN": None, "LMSP_URL": None}
    environment.update(env)
    return CliRunner().invoke(
        main, list(args), prog_name="lmsp", env=environment, catch_exceptions=False
    )


# -- help ------------------------------------------------------------------------------


def test_every_option_says_the_same_thing_everywhere() -> None:
    seen: dict[str, dict[str, list[str]]] = {}
    tree = [(("lmsp",), main), *[(("lmsp", *p), c) for p, c in commands()]]
    for path, command in tree:
        assert command.help or command.short_help, f"{' '.join(path)} says nothing"
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            assert param.help, f"{' '.join(path)} {param.opts[-1]} has no help"
            for flag in param.opts:
                if flag.startswith("--"):
                    seen.setdefault(flag, {}).setdefault(param.help, []).append(" ".join(path))
    differing = {
        flag: helps
        for flag, helps in seen.items()
        if len(helps) > 1 and flag not in MEANS_ANOTHER_THING
    }
    assert not differing, differing
    for flag, words in (
        ("--url", URL_HELP),
        ("--token", TOKEN_HELP),
        ("--json", JSON_HELP),
        ("--data-dir", DATA_DIR_HELP),
    ):
        assert list(seen[flag]) == [words]
    assert "table" not in JSON_HELP  # several commands that take it print no table
    for flag in MEANS_ANOTHER_THING:
        assert len(seen[flag]) > 1, f"{flag} says one thing now: take it off the list"


def test_every_command_that_talks_to_the_service_takes_the_same_three_options() -> None:
    for path, command in leaves():
        names = {flag for p in command.params if isinstance(p, click.Option) for flag in p.opts}
        if remote(command):
            assert {"--url", "--token", "--json"} <= names, path


def test_no_summary_is_cut_short_in_a_listing() -> None:
    groups = [((), main)] + [(p, c) for p, c in commands() if isinstance(c, click.Group)]
    for path, group in groups:
        assert isinstance(group, click.Group)
        room = 80 - 6 - max(len(name) for name in children(group))  # click's own layout
        listing = invoke(*path, "-h", COLUMNS="80")
        for name, command in children(group).items():
            summary = command.get_short_help_str(limit=room)
            assert summary and not summary.endswith("..."), ((*path, name), summary)
            assert summary in " ".join(listing.stdout.split()), (path, name)


# -- errors ----------------------------------------------------------------------------


def test_no_command_raises_a_bare_click_exception() -> None:
    """Errors are made by :class:`lmsp.cli.errors.CliError`, which needs a code."""
    package = Path(lmsp.cli.__file__).parent
    for source in package.glob("*.py"):
        if source.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                assert not called.endswith("ClickException"), (source.name, node.lineno)
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = ast.unparse(node.exc)
                assert not raised.startswith("SystemExit(1"), (source.name, node.lineno)


@pytest.mark.parametrize("path", [p for p, _ in commands()] + [()], ids=" ".join)
def test_a_command_line_that_does_not_parse_is_one_line(path: tuple[str, ...]) -> None:
    found = one_error(invoke(*path, "--no-such-option"), "usage")
    assert f"see `{' '.join(('lmsp', *path))} -h`" in found["message"]
    assert invoke(*path, "--no-such-option").exit_code == 2


def test_a_bad_value_and_a_missing_argument_are_one_line() -> None:
    found = one_error(invoke("run", "x", "--on-restart", "never"), "usage")
    assert "'--on-restart'" in found["message"] and "see `lmsp run -h`" in found["message"]
    one_error(invoke("tasks", "show"), "usage")
    one_error(invoke("gc", "--retention", "soon"), "usage")
    one_error(invoke("ps", "--watch", "--json"), "usage")
    one_error(invoke("models", "set", "m"), "usage")
    one_error(invoke("no-such-command"), "usage")


def test_every_remote_command_without_a_service_is_one_line(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 10)
    checked = 0
    for path, command in leaves():
        if not remote(command):
            continue
        result = invoke(*path, *filled(command, junk), "--url", nowhere, "--token", "t")
        found = one_error(result)
        if path == ("models", "add"):  # refused before it connects
            assert found["code"] == "invalid_model_file"
        else:
            assert found["code"] == "unreachable", (path, found[0])
            assert nowhere in found["message"] and "`lmsp serve`" in found["message"]
        checked += 1
    assert checked >= 15


def test_local_commands_are_one_line_too(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    one_error(invoke("gc", "--data-dir", str(empty)), "no_database")
    one_error(invoke("doctor", "--data-dir", str(empty)), "checks_failed")
    one_error(invoke("tasks", "ls", LMSP_PORT="many"), "invalid_setting")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("voice") / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.05"}).start()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_every_remote_command_without_a_token_names_where_it_looked(
    server: Server, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "other-data"
    model = next(p for p in (server.data_dir / "blobs").iterdir() if p.stat().st_size > 1000)
    for path, command in leaves():
        if not remote(command):
            continue
        result = invoke(
            *path, *filled(command, model), LMSP_URL=server.url, LMSP_DATA_DIR=str(elsewhere)
        )
        found = one_error(result, "invalid_token")
        message = found["message"]
        assert message.startswith("No token: "), (path, message)
        assert str(elsewhere / "owner.token") in message and "--token" in message, message


@pytest.mark.slow
def test_refusals_of_the_service_are_one_line(server: Server) -> None:
    env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir)}
    for args in (
        ("tasks", "show", "task_missing"),
        ("tasks", "follow", "task_missing"),
        ("tasks", "cancel", "task_missing"),
        ("clients", "revoke", "cli_missing"),
        ("models", "rm", "nope"),
        ("models", "verify", "nope"),
        ("models", "set", "nope", "--temperature", "1"),
    ):
        one_error(invoke(*args, **env), "not_found")
    one_error(invoke("pair", "approve", "ZZZZ-ZZZZ", **env), "not_found")
    refused = one_error(invoke("tasks", "ls", "--token", "lmsp_wrong", **env), "invalid_token")
    assert "--token was refused" in refused["message"]


@pytest.mark.slow
def test_following_a_cancelled_task_says_so_with_a_code(server: Server) -> None:
    with server.client() as http:
        created = http.post(
            "/v1/responses", json={"model": "lmsp-test", "input": "x", "background": True}
        ).json()
        http.post(f"/v1/responses/{created['id']}/cancel")
    env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir)}
    found = one_error(invoke("tasks", "follow", created["task"]["id"], **env), "cancelled")
    assert found["message"] == "the response was cancelled"
