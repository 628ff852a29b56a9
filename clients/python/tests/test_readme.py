"""Every example of the package's README, run against real servers.

The examples' placeholders are replaced by this test's servers: `TARGET`, `SERVER_KEY` and
`KEY` name the `noise+ws://` server and its keys; the first example's relay URL becomes the
test relay's `relay+ws://` URL (this relay listens without TLS), `server.pub` and
`~/.config/execrelay/id` the test keys, `/work` a scratch directory with a Makefile, and
`train.py` a script there that waits for "go" on stdin.
"""

from __future__ import annotations

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def examples() -> list:
    with open(README) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_has_the_examples():
    assert len(examples()) == 4


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "Makefile").write_text("all:\n\t@for i in 1 2 3 4 5 6 7; do echo line $$i; done\n")
    (tmp_path / "train.py").write_text(
        "import sys\nprint('ready')\nline = sys.stdin.readline()\nprint('got', line.strip())\n")
    return tmp_path


def run_example(code: str, env: dict, capsys) -> str:
    exec(compile(code, README, "exec"), env)  # noqa: S102 - the README's own examples
    return capsys.readouterr().out


def common(noise_url: str, creds: dict) -> dict:
    return {"TARGET": noise_url, "SERVER_KEY": creds["server_key"], "KEY": creds["key"],
            "__name__": "readme_example"}


def test_example_1_relay_run_and_start(relay_url, creds, scratch, capsys):
    code = examples()[0]
    code = code.replace("relay+wss://relay.example.com:443/sandbox-1", relay_url)
    code = code.replace('"server.pub"', repr(creds["server_key"]))
    code = code.replace('"~/.config/execrelay/id"', repr(creds["key"]))
    code = code.replace('"/work"', repr(str(scratch)))
    code = code.replace('"train.py"', repr(str(scratch / "train.py")))
    env = {"__name__": "readme_example"}
    # The relay's environment may still be registering: retry while it says offline.
    import time
    import execrelay
    deadline = time.monotonic() + 30
    while True:
        try:
            out = run_example(code, env, capsys)
            break
        except execrelay.ConnectError as e:
            if "offline" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    r, res = env["r"], env["res"]
    assert r.exit_code == 0 and r.signal is None and r.reason == "exited"
    assert r.stdout == b"".join(b"line %d\n" % i for i in range(3, 8))
    assert r.stderr == b""
    assert r.duration >= 0
    assert res.exit_code == 0
    assert "ready\ngot go\n" in out


def test_example_2_asyncio(noise_url, creds, capsys):
    env = common(noise_url, creds)
    out = run_example(examples()[1], env, capsys)
    assert out.startswith("Linux ")


def test_example_3_events_tty_signals_errors(noise_url, creds, capsys):
    env = common(noise_url, creds)
    out = run_example(examples()[2], env, capsys)
    assert "stdout b'1\\n" in out  # the loop's output, in one chunk or more
    assert "stderr b'done\\n'" in out
    assert "exit 0" in out
    assert "50 132" in out
    assert "SIGINT" in out
    assert "exit status as a shell says it: 127" in out
    assert "exited with status 3" in out


def test_example_4_approval(servers, creds, capsys):
    policy = servers.write_file("readme-policy.toml",
                                'default = "allow"\n[[rule]]\nprogram = "echo"\naction = "ask"\n'
                                'reason = "says things"\n')
    url = servers.noise("--exec-policy", policy).url
    env = common(url, creds)
    out = run_example(examples()[3], env, capsys)
    assert "the server asks about ['echo', 'approved'] because says things" in out
    assert "b'approved\\n'" in out
