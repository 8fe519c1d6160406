"""The dashboard in a real terminal (tmux) on the real SmolLM2: the pill turns SERVING, a chat
round trip shows the answer, quitting stops the server; SIGTERM stops it gracefully too (an
in-flight stream finishes, exit 0, the terminal restored); and the plain-log fallback when
stdout is not a TTY.

Both run the real ``met serve`` command."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from metrale_core.testing.requires import needs_file

SMOL = Path.home() / ".cache/metrale/models/SmolLM2-135M-Instruct.Q4_1.gguf"
MET = Path(sys.executable).with_name("met")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    needs_file(SMOL, "scripts/fetch-test-data.sh fetches it"),
]


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def _wait_pane(session: str, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if needle in screen:
            return screen
        assert time.monotonic() < deadline, f"{needle!r} never appeared; screen:\n{screen}"
        time.sleep(0.25)


def _start_dashboard(session: str, exit_file: Path, port: int = 0, *flags: str, after: str = "") -> None:
    """``met serve`` (the dashboard) on SmolLM2 in a new 160x40 tmux ``session``; the shell writes
    its exit status to ``exit_file``, then runs ``after``."""
    serve = " ".join(("--port", str(port), "--kv-cache-memory", "64M", "--max-model-len", "2048", *flags))
    command = (
        f"cd {ROOT} && unset COLUMNS LINES && TERM=xterm-256color {MET} serve --model {SMOL} {serve}; "
        f"echo $? > {exit_file}{after}"
    )
    _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "40", command)


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")


@needs_tmux
def test_dashboard_in_tmux_serves_and_chats(tmp_path):
    session = f"metrale-tui-{uuid.uuid4().hex[:8]}"
    exit_file = tmp_path / "exit"
    _start_dashboard(session, exit_file)
    try:
        screen = _wait_pane(session, "SERVING", timeout=120)
        header = screen.splitlines()[0]
        assert "M E T R A L E" in header and "model SmolLM2-135M-Instruct" in header, screen
        assert "✓ load model" in screen and "tensors 272/272" in screen
        _tmux("send-keys", "-t", session, "4")
        time.sleep(0.5)
        _tmux("send-keys", "-t", session, "-l", "What is the capital of France?")
        _tmux("send-keys", "-t", session, "Enter")
        screen = _wait_pane(session, "Paris", timeout=60)
        answer = next(line for line in screen.splitlines() if "assistant " in line)
        assert "Paris" in answer
        _tmux("send-keys", "-t", session, "Escape")
        time.sleep(0.5)  # apart from the next key, or the terminal reads alt+q
        _tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 30
        while not exit_file.exists():
            assert time.monotonic() < deadline, "quitting the dashboard did not stop the server"
            time.sleep(0.2)
        assert exit_file.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pane_child(session: str) -> int:
    """The pid of the command the pane's shell runs (``met serve``)."""
    shell = _tmux("list-panes", "-t", session, "-F", "#{pane_pid}").split()[0]
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", shell], capture_output=True, text=True).stdout.split()
    assert len(children) == 1, children
    return int(children[0])


@needs_tmux
def test_sigterm_stops_the_dashboard_gracefully(tmp_path):
    # The grace period is generous so that the in-flight stream finishes inside it on a loaded
    # machine too (the test asserts the order: the stream ends, then met exits 0); at 10 s a run
    # beside two builds saw the stream cut at the grace's end.  The stream is long enough that it
    # is still running when SIGTERM arrives.
    grace = 120
    session = f"metrale-tui-{uuid.uuid4().hex[:8]}"
    exit_file = tmp_path / "exit"
    port = _free_port()
    # the pane stays (sleep) so that what the shell prints after met exits can be read
    _start_dashboard(session, exit_file, port, "--shutdown-grace", str(grace), after="; echo met-exited; sleep 60")
    try:
        _wait_pane(session, "SERVING", timeout=120)
        pid = _pane_child(session)
        lines: list[str] = []
        errors: list[BaseException] = []
        ended: list[float] = []

        def stream() -> None:
            body = {
                "model": SMOL.stem,
                "messages": [{"role": "user", "content": "Count to 100."}],
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
            }
            try:
                with httpx.stream(
                    "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60
                ) as reply:
                    assert reply.status_code == 200
                    for line in reply.iter_lines():
                        if line:
                            lines.append(line)
            except BaseException as exc:
                errors.append(exc)
            ended.append(time.monotonic())

        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while len(lines) < 4:  # the role chunk and a few tokens: the request is in flight
            assert not errors and thread.is_alive(), (errors, lines)
            assert time.monotonic() < deadline, "the stream never started"
            time.sleep(0.01)
        assert "data: [DONE]" not in lines
        killed = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        thread.join(grace + 15)
        assert not thread.is_alive() and not errors, (errors, lines[-3:])
        assert lines[-1] == "data: [DONE]", lines[-3:]
        if '"finish_reason":"length"' not in lines[-2]:  # cut short: only once the grace period is over
            assert '"shutting_down"' in lines[-2] and ended[0] - killed >= grace - 1, lines[-3:]

        deadline = time.monotonic() + grace + 20
        while not exit_file.exists():
            assert time.monotonic() < deadline, "SIGTERM did not stop met serve"
            time.sleep(0.2)
        time.sleep(0.3)
        assert exit_file.read_text().strip() == "0"
        screen = _wait_pane(session, "met-exited", timeout=10)
        history = _tmux("capture-pane", "-p", "-S", "-", "-t", session)
        assert "Traceback" not in history and "Terminated" not in history, history
        # the terminal is restored: off the alternate screen, M E T R A L E gone
        assert _tmux("display-message", "-p", "-t", session, "#{alternate_on}").strip() == "0"
        assert "M E T R A L E" not in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_plain_logs_when_stdout_is_not_a_tty(tmp_path):
    port = _free_port()
    env = {**os.environ, "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [
            str(MET),
            "--log-level",
            "info",
            "serve",
            "--model",
            str(SMOL),
            "--port",
            str(port),
            "--kv-cache-memory",
            "64M",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the plain server never became healthy"
            time.sleep(0.25)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    # uvicorn re-raises the signal after its graceful shutdown
    assert proc.returncode in (0, 130) and "Traceback" not in err  # 130: met reports the ^C
    assert f"on http://127.0.0.1:{port}/v1" in err and "ready in" in err  # plain log lines
    assert "\x1b[" not in out + err and "M E T R A L E" not in out + err
