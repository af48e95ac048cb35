"""The SysV init script: LSB behaviour without a daemon, and a full cycle with a real one."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO, require_peer, require_root
from tests.packaging.simfabric import IBACM, Hub, NodeFiles, node_files, process_gone, wait_for

INIT = REPO / "packaging" / "ibacm.init"


def run_init(
    action: str, env: Mapping[str, str], *, as_nobody: bool = False, init: Path = INIT
) -> subprocess.CompletedProcess[str]:
    """Run the script with /bin/sh, the way init systems run it."""
    base = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        # Never hand the action to systemctl, even on a systemd host.
        "SYSTEMCTL_SKIP_REDIRECT": "1",
    }
    with contextlib.ExitStack() as stack:
        script = init
        prefix: list[str] = []
        if as_nobody and os.geteuid() == 0:
            setpriv = require_peer("setpriv")
            prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
            script = stack.enter_context(readable_copy(init))
        return subprocess.run(
            [*prefix, "/bin/sh", str(script), action],
            capture_output=True,
            text=True,
            env={**base, **env},
            timeout=120,
            check=False,
        )


@contextlib.contextmanager
def readable_copy(path: Path) -> Iterator[Path]:
    """A copy of ``path`` that any user can read: the checkout may sit in a directory only its
    owner can enter (a clone into ``mktemp -d``), where uid 65534 cannot open the original."""
    with tempfile.TemporaryDirectory(prefix="ibacm-init-") as directory:
        os.chmod(directory, 0o755)
        copy = Path(directory) / path.name
        shutil.copyfile(path, copy)
        copy.chmod(0o755)
        yield copy


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Settings pointing every file of the script into a private directory."""
    config = tmp_path / "ibacm_opts.cfg"
    config.write_text(f"lock_file {tmp_path / 'ibacm.pid'}\n")
    yield {"CONFIG": str(config), "DAEMON": shutil.which("true") or "/bin/true"}


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not ibacm, whose pid a stale pid file may hold."""
    sleeper = subprocess.Popen(["sleep", "300"])
    yield sleeper
    sleeper.kill()
    sleeper.wait()


def test_script_is_valid_posix_shell() -> None:
    for shell in ("/bin/sh", shutil.which("dash"), shutil.which("bash")):
        if shell:
            subprocess.run([shell, "-n", str(INIT)], check=True, timeout=30)


def test_lsb_and_chkconfig_headers() -> None:
    text = INIT.read_text()
    block = text.split("### BEGIN INIT INFO\n", 1)[1].split("### END INIT INFO", 1)[0]
    headers = dict(
        (key.strip(), value.strip())
        for key, value in re.findall(r"^# ([A-Za-z-]+):\s*(.*)$", block, re.MULTILINE)
    )
    assert headers["Provides"] == "ibacm"
    assert headers["Required-Start"].split() == ["$network", "$remote_fs"]
    assert headers["Default-Start"].split() == ["2", "3", "4", "5"]
    assert headers["Default-Stop"].split() == ["0", "1", "6"]
    assert re.search(r"^# chkconfig: 2345 25 75$", text, re.MULTILINE)
    assert os.access(INIT, os.X_OK)


def test_status_without_pid_file_is_stopped(scratch: dict[str, str]) -> None:
    done = run_init("status", scratch)
    assert done.returncode == 3
    assert "stopped" in done.stdout


def test_status_does_not_need_root(scratch: dict[str, str], tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    Path(scratch["CONFIG"]).chmod(0o644)
    done = run_init("status", scratch, as_nobody=True)
    assert done.returncode == 3


def test_unprivileged_runs_work_from_a_checkout_only_its_owner_enters(
    scratch: dict[str, str], tmp_path: Path
) -> None:
    # A clone into `mktemp -d` (0700): uid 65534 cannot read the script where it lies.
    private = tmp_path / "checkout"
    private.mkdir(mode=0o700)
    init = Path(shutil.copy2(INIT, private / INIT.name))
    tmp_path.chmod(0o755)
    Path(scratch["CONFIG"]).chmod(0o644)
    assert run_init("status", scratch, as_nobody=True, init=init).returncode == 3
    done = run_init("stop", scratch, as_nobody=True, init=init)
    assert done.returncode == 4 and "root" in done.stdout + done.stderr


@pytest.mark.parametrize(
    "action", ["start", "stop", "restart", "reload", "try-restart", "force-reload"]
)
def test_actions_that_change_state_need_root(scratch: dict[str, str], action: str) -> None:
    if os.geteuid() != 0:
        done = run_init(action, scratch)
    else:
        done = run_init(action, scratch, as_nobody=True)
    assert done.returncode == 4
    assert "root" in done.stdout + done.stderr


def test_unknown_action_prints_usage(scratch: dict[str, str]) -> None:
    done = run_init("explode", scratch)
    assert done.returncode == 2
    assert "Usage:" in done.stderr
    assert "force-reload" in done.stderr


def test_pid_file_comes_from_the_option_files_lock_file(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    # Last occurrence wins, keys are case-insensitive, '#' lines are comments: the daemon's
    # own rules, so both agree on the file.
    chosen = tmp_path / "chosen.pid"
    config = tmp_path / "opts.cfg"
    config.write_text(
        f"lock_file {tmp_path / 'first.pid'}\n# lock_file {tmp_path / 'commented.pid'}\n"
        f"LOCK_FILE {chosen}\n"
    )
    chosen.write_text(f"{bystander.pid}\n")
    done = run_init("status", {"CONFIG": str(config)})
    assert done.returncode == 1
    assert str(chosen) in done.stdout


def test_stale_pid_of_another_program_is_never_signalled(
    scratch: dict[str, str], tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "ibacm.pid"
    pidfile.write_text(f"{bystander.pid}\n")
    status = run_init("status", scratch)
    assert status.returncode == 1
    assert "dead" in status.stdout
    require_root("stop and reload")
    assert run_init("reload", scratch).returncode == 7
    stop = run_init("stop", scratch)
    assert stop.returncode == 0
    assert "not running" in stop.stdout
    time.sleep(0.2)
    assert bystander.poll() is None, "the init script signalled a process that is not ibacm"
    assert not pidfile.exists()


def test_start_reports_a_missing_daemon(scratch: dict[str, str], tmp_path: Path) -> None:
    require_root("start")
    done = run_init("start", {**scratch, "DAEMON": str(tmp_path / "no-such-ibacm")})
    assert done.returncode == 5
    assert "not installed" in done.stdout + done.stderr


def test_try_restart_of_a_stopped_daemon_does_nothing(scratch: dict[str, str]) -> None:
    require_root("try-restart")
    for action in ("try-restart", "condrestart", "force-reload"):
        done = run_init(action, scratch)
        assert done.returncode == 0, action
        assert "not running" in done.stdout


# ---------------------------------------------------------------------------------------------
# With a real daemon on the simulated fabric


def daemon_env(files: NodeFiles) -> dict[str, str]:
    return {
        "DAEMON": str(IBACM),
        "CONFIG": str(files.options),
        "DAEMON_ARGS": " ".join(files.daemon_args()),
        "STOP_TIMEOUT": "20",
    }


@pytest.mark.slow
def test_full_cycle_with_a_real_daemon(sim_hub: Hub, tmp_path: Path) -> None:
    require_root("start and stop")
    files = node_files(tmp_path, sim_hub, "node3")
    env = daemon_env(files)
    try:
        start = run_init("start", env)
        assert start.returncode == 0, start.stdout + start.stderr
        pid = int(files.pid_file.read_text())
        assert f"pid {pid}" in start.stdout
        assert files.unix_socket.exists()

        status = run_init("status", env)
        assert (status.returncode, f"pid {pid}" in status.stdout) == (0, True)
        assert run_init("start", env).stdout.count("already running") == 1

        reload = run_init("reload", env)
        assert reload.returncode == 0, reload.stdout + reload.stderr
        wait_for(lambda: "configuration reloaded" in files.log_file.read_text(), 20, "reload")
        assert int(files.pid_file.read_text()) == pid

        restart = run_init("try-restart", env)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        new_pid = int(files.pid_file.read_text())
        assert new_pid != pid
        assert process_gone(pid)

        stop = run_init("stop", env)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert process_gone(new_pid)
        # The daemon removed its own files on the clean exit.
        assert not files.pid_file.exists()
        assert not files.unix_socket.exists()
        assert run_init("status", env).returncode == 3
    finally:
        if files.pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(files.pid_file.read_text()), signal.SIGKILL)


@pytest.mark.slow
def test_start_reports_the_daemons_own_failure(sim_hub: Hub, tmp_path: Path) -> None:
    require_root("start")
    files = node_files(tmp_path, sim_hub, "node-that-does-not-exist")
    done = run_init("start", daemon_env(files))
    assert done.returncode == 1
    assert "failed to start (exit status 1)" in done.stdout + done.stderr
    assert not files.pid_file.exists()
