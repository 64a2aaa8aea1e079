"""Settings: each declared once (variable, type, bounds, default, help), read in one loop;
a bad value says what its variable must be, as it always did."""

from __future__ import annotations

import os
from dataclasses import fields

import click
import pytest

from lmsp import config
from lmsp.cli import gc, serve
from lmsp.config import Settings, declarations, declared, from_env


def test_every_field_but_the_test_seam_is_declared_once() -> None:
    undeclared = [f.name for f in fields(Settings) if config.DECLARATION not in f.metadata]
    assert undeclared == ["in_thread_engines"]  # no variable sets it (tests only)
    names = [d.env for d in declarations()]
    assert len(names) == len(set(names)) == len(fields(Settings))  # + LMSP_THREADS
    assert "LMSP_THREADS" in names and "HF_TOKEN" in names


def test_each_default_is_its_text_read_as_the_variable_would_be() -> None:
    """A declared default is written as in the environment (``7d``, ``100ms``); the
    field's value is that text read by the variable's own parser, within its bounds."""
    defaults = Settings()
    for spec in fields(Settings):
        decl = spec.metadata.get(config.DECLARATION)
        if decl is None or decl.default is None:
            continue
        assert getattr(defaults, spec.name) == decl.read(decl.default), decl.env
    assert defaults.retention == 7 * 86400 and defaults.flush_interval == 0.1
    assert defaults.rope_scaling is True and defaults.exact is False


def test_a_setting_read_from_its_variable() -> None:
    env = {
        "LMSP_DATA_DIR": "~/lmsp-data",
        "LMSP_PORT": "9000",
        "LMSP_RETENTION": "12h",
        "LMSP_FLUSH_INTERVAL": "250ms",
        "LMSP_EXACT": "yes",
        "LMSP_ROPE_SCALING": "none",
        "LMSP_ALLOWED_HOSTS": "a.example, b.example,",
        "LMSP_HF_ENDPOINT": "https://hub.example/",
        "HF_TOKEN": " hf_secret ",
        "LMSP_EMBED_SHARE": "0.5",
        "LMSP_MCP_HOSTS": "127.0.0.2:8080,*",
        "LMSP_WEBHOOK_HOSTS": "hooks.example",
        "LMSP_DEFAULT_LIMITS": "max_queued=5",
        "LMSP_DATABASE_URL": "postgres://db.example/lmsp",
        "LMSP_NODE_ID": "",  # empty: unset
    }
    s = from_env(env)
    assert s.data_dir == config.Path("~/lmsp-data").expanduser() and s.port == 9000
    assert (s.retention, s.flush_interval) == (43200.0, 0.25)
    assert s.exact is True and s.rope_scaling is False
    assert s.allowed_hosts == ("a.example", "b.example")
    assert s.hf_endpoint == "https://hub.example" and s.hf_token == "hf_secret"
    assert s.embed_share == 0.5 and s.mcp_hosts == ("127.0.0.2:8080", "*")
    assert s.webhook_hosts == "hooks.example" and s.default_limits == (("max_queued", 5),)
    assert s.database_url == "postgres://db.example/lmsp" and s.node_id is None
    assert "hf_secret" not in repr(s)


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("LMSP_PARALLEL", "0", "LMSP_PARALLEL must be at least 1"),
        ("LMSP_RESERVED_SEQUENCES", "9", "LMSP_RESERVED_SEQUENCES must be from 0 to 8"),
        ("LMSP_N_CTX", "-1", "LMSP_N_CTX must be 0 (the model's own) or more"),
        ("LMSP_KV_BUDGET", "1048575", "LMSP_KV_BUDGET must be at least 1048576 bytes"),
        ("LMSP_FLUSH_INTERVAL", "4ms", "LMSP_FLUSH_INTERVAL must be between 5ms and 1s"),
        ("LMSP_FLUSH_INTERVAL", "1.5s", "LMSP_FLUSH_INTERVAL must be between 5ms and 1s"),
        ("LMSP_PAIRING_TTL", "0.5s", "LMSP_PAIRING_TTL must be at least 1s"),
        ("LMSP_HEADER_TIMEOUT", "0s", "LMSP_HEADER_TIMEOUT must be more than 0s"),
        ("LMSP_INPUT_MEMORY", "1000", "LMSP_INPUT_MEMORY must be at least 67108864"),
        ("LMSP_ENGINE_RESTARTS", "-1", "LMSP_ENGINE_RESTARTS must be 0 or more"),
        ("LMSP_KV_CACHE_BYTES", "-1", "LMSP_KV_CACHE_BYTES must be 0 (off) or more"),
        ("LMSP_KV_CACHE_RESERVE", "-5", "LMSP_KV_CACHE_RESERVE must be 0 or more bytes"),
        ("LMSP_CONVERSATION_MAX_ITEMS", "-1", "must be 0 (no limit) or more"),
        ("LMSP_EMBED_SHARE", "0.001", "LMSP_EMBED_SHARE must be between 0.01 and 1"),
        ("LMSP_MCP_MAX_BYTES", "4095", "LMSP_MCP_MAX_BYTES must be at least 4096"),
        ("LMSP_HTTP", "h2", "LMSP_HTTP must be auto, httptools or h11"),
        ("LMSP_LOG_FORMAT", "xml", "LMSP_LOG_FORMAT must be text or json"),
        ("LMSP_ROPE_SCALING", "linear", "LMSP_ROPE_SCALING must be yarn or none"),
        (
            "LMSP_DEFAULT_ON_RESTART",
            "never",
            "LMSP_DEFAULT_ON_RESTART must be one of ('fail', 'retry', 'resume')",
        ),
        ("LMSP_DATABASE_URL", "mysql://x", "LMSP_DATABASE_URL must be a postgresql:// URL"),
        ("LMSP_HF_ENDPOINT", "ftp://hub", "LMSP_HF_ENDPOINT must be an http(s):// URL"),
        ("LMSP_RETENTION", "soon", "invalid duration 'soon' (use e.g. 30s, 15m, 12h, 7d)"),
        ("LMSP_PORT", "http", "invalid literal for int() with base 10: 'http'"),
        ("LMSP_DEFAULT_LIMITS", "nope=1", "LMSP_DEFAULT_LIMITS: unknown limit 'nope'"),
        ("LMSP_MCP_HOSTS", "a.example/path", "LMSP_MCP_HOSTS: 'a.example/path' is not host[:port]"),
        ("LMSP_WEBHOOK_HOSTS", "user@a.example", "LMSP_WEBHOOK_HOSTS: 'user@a.example' is not"),
    ],
)
def test_a_bad_value_says_what_its_variable_must_be(env: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        from_env({env: value})
    assert message in str(caught.value)


def test_every_duration_is_read_by_one_parser() -> None:
    """``90m`` means the same to every duration setting."""
    durations = [
        (spec.name, decl)
        for spec in fields(Settings)
        if (decl := spec.metadata.get(config.DECLARATION)) and decl.kind is config.DURATION
    ]
    assert len(durations) > 20
    got = from_env({decl.env: "90m" for _, decl in durations if decl.env != "LMSP_FLUSH_INTERVAL"})
    assert {
        getattr(got, name) for name, decl in durations if decl.env != "LMSP_FLUSH_INTERVAL"
    } == {5400.0}


def test_engine_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMSP_THREADS", "3")
    assert config.engine_threads() == 3
    monkeypatch.setenv("LMSP_THREADS", "0")
    assert config.engine_threads() == (os.cpu_count() or 1)
    monkeypatch.delenv("LMSP_THREADS")
    assert config.engine_threads() == (os.cpu_count() or 1)


def test_the_command_line_options_name_their_variable_and_default() -> None:
    """``lmsp serve``'s flags are the declared ones; each option's help says which
    variable sets it too and its default, from the declaration."""
    options = {p.opts[0]: p for p in serve.params if isinstance(p, click.Option)}
    flagged = [d for d in declarations() if d.flag]
    # --standby is how this process starts (a mode of the command), not a setting
    assert {d.flag for d in flagged} == set(options) - {"--help", "--standby"}
    assert options["--standby"].is_flag
    for decl in flagged:
        assert options[decl.flag].help == decl.option_help(options[decl.flag].help.split(" (")[0])
    assert options["--host"].help == "Address to bind (LMSP_HOST; default 127.0.0.1)."
    assert options["--data-dir"].help == (
        "Data directory (LMSP_DATA_DIR; default ~/.local/share/lmsp)."
    )
    retention = next(p for p in gc.params if p.name == "retention")
    assert isinstance(retention, click.Option)
    assert retention.help == declared("retention").option_help(
        "Keep finished work this long: 30s, 12h, 7d"
    )
