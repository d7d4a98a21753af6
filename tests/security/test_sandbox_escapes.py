"""Hostile model-written code stays inside the OS sandbox (bubblewrap).

Each payload tries one way out that worked against the audit-hook-only sandbox: writes through
sqlite3, ctypes and ``os.open``; reads of a planted secret; new processes through
``_posixsubprocess.fork_exec``, ``os.fork`` and ctypes ``fork()`` + ``setsid()``; sockets (ctypes
ones too) to a loopback server this test runs; the parent's ``/proc/<pid>/environ``; fork bombs;
memory and CPU exhaustion; a flood of stdout. The payloads that leave a visible trace go end to end
through the shared runner, spreadsheetbench's episode and its scorer (the target's answer is the
payload, and what it read would show up as the predicted cell value); the rest go through the
sandbox API directly. Every test
checks the host side: the file was not written, the server saw no connection, the secret is in no
output, and no process of the run's pid namespace is left.
"""

from __future__ import annotations

import os
import re
import socket
import textwrap
import threading
from pathlib import Path

import pytest

from skillopt.sandbox.confine import run_confined, run_sandboxed, sandbox_status

# CI sets SKILLOPT_REQUIRE_SANDBOX=1: there a missing sandbox fails the tests that need one instead of
# skipping them (the other security modules import this mark).
requires_sandbox = pytest.mark.skipif(
    not sandbox_status().available and not os.environ.get("SKILLOPT_REQUIRE_SANDBOX"),
    reason=f"no OS sandbox on this host: {sandbox_status().detail}")
pytestmark = requires_sandbox

SECRET = "SENTINEL-sandbox-4b1d-secret"
NAMESPACE = re.compile(r"NS=(pid:\[\d+\])")


def live_in_namespace(link: str) -> list[int]:
    """Host pids of live (not zombie) processes whose pid namespace is ``link`` (``pid:[inode]``). A
    zombie has exited; it only waits for the host's init to collect its exit status."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == link:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(pid))
        except OSError:
            continue
    return found


def assert_namespace_gone(output: str) -> None:
    match = NAMESPACE.search(output)
    assert match, f"the payload did not report its namespace: {output[-500:]}"
    assert live_in_namespace(match.group(1)) == []


def run(code: str, workspace: Path, **kwargs):
    return run_sandboxed(["-c", textwrap.dedent(code)], workspace, kwargs.pop("timeout_s", 20),
                         kwargs.pop("mem_mb", 512), **kwargs)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "workspace"
    folder.mkdir()
    return folder


# ------------------------------------------------------------------ end to end through the scorer

@pytest.fixture
def sheet_item(tmp_path):
    from tests.unit.test_benchmark_spreadsheetbench import ORDERS, fixture_items

    return fixture_items(tmp_path)[ORDERS]


def score_payload(item, payload: str) -> tuple[str, str]:
    """Roll ``item`` out with a target whose answer is a script that runs ``payload`` (which sets ``value``)
    and writes ``value`` into the graded cell D2, through the real runner, episode and scorer; whatever
    the payload obtained shows up in the row's fail reason as ``pred=…`` (cut short). Returns the fail
    reason and everything the row holds."""
    from skillopt.benchmarks.runner import run_item
    from skillopt.benchmarks.spreadsheetbench import plugin
    from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of

    body = textwrap.dedent(payload)
    script = ("import openpyxl\nvalue = 'nothing'\n" + body + "\nwb = openpyxl.load_workbook(INPUT_PATH)\n"
              "wb['Sheet1']['D2'] = str(value)\nwb.save(OUTPUT_PATH)\n")
    target = PluginScriptedTarget(plugin, rules=[{"name": "payload", "stage": "rollout",
                                                  "text": f"```python\n{script}```"}])
    row = run_item(plugin, item, "", fixture_config_of(plugin), target=target, judge=None)
    assert target.requests, "the target was never asked"
    return row.fail_reason, row.model_dump_json()


def test_writes_outside_the_workspace_through_sqlite_ctypes_and_os_open_land_nowhere(sheet_item, tmp_path):
    targets = {name: tmp_path / f"escaped-{name}" for name in ("sqlite", "ctypes", "osopen", "parent")}
    payload = f"""
    import ctypes, os, sqlite3
    done = []
    try:
        db = sqlite3.connect({str(targets['sqlite'])!r}); db.execute('create table t (x)'); db.commit()
        done.append('sqlite')
    except Exception as exc:
        done.append('sqlite-' + type(exc).__name__)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open({str(targets['ctypes']).encode()!r}, os.O_CREAT | os.O_WRONLY, 0o644)
    done.append('ctypes-fd%d' % fd)
    if fd >= 0:
        libc.write(fd, b'pwned', 5)
    try:
        os.close(os.open({str(targets['osopen'])!r}, os.O_CREAT | os.O_WRONLY))
        done.append('osopen')
    except Exception as exc:
        done.append('osopen-' + type(exc).__name__)
    fd = libc.open(b'../escaped-parent', os.O_CREAT | os.O_WRONLY, 0o644)
    value = 'attempted:' + ','.join(done)
    """
    outcome, _ = score_payload(sheet_item, payload)
    assert "pred='attempted:" in outcome, outcome  # the payload ran to the end
    for target in targets.values():
        assert not target.exists(), f"{target} was written from inside the sandbox: {outcome}"


def test_a_planted_secret_outside_the_workspace_cannot_be_read(sheet_item, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text(f"-----BEGIN KEY-----\n{SECRET}\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    payload = f"""
    import ctypes, os
    libc = ctypes.CDLL(None)
    fd = libc.open({str(key).encode()!r}, 0)
    buffer = ctypes.create_string_buffer(200)
    found = ['c%d:' % fd + (buffer.raw[:libc.read(fd, buffer, 200)].decode() if fd >= 0 else '')]
    for path in ({str(key)!r}, os.path.expanduser('~/.ssh/id_rsa'), '/etc/passwd', '/etc/shadow'):
        try:
            found.append(open(path).read())
        except Exception as exc:
            found.append(type(exc).__name__[:4])
    value = '|'.join(found)
    """
    outcome, everything = score_payload(sheet_item, payload)
    assert "pred='c-1:|File|File|File|File" in outcome, outcome  # each read found no such file
    assert SECRET not in everything and "root:" not in everything


def test_sockets_plain_and_ctypes_never_reach_a_loopback_server(sheet_item):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    payload = f"""
    import ctypes, socket, struct, _socket
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(2, 1, 0)
    address = struct.pack('=H', 2) + struct.pack('!H4s8x', {port}, bytes([127, 0, 0, 1]))
    tried = ['c%d' % libc.connect(fd, address, len(address))]
    for module in (socket, _socket):
        try:
            sock = module.socket(module.AF_INET, module.SOCK_STREAM)
            sock.settimeout(2)
            sock.connect(('127.0.0.1', {port}))
            tried.append('CONNECTED')
        except Exception as exc:
            tried.append(type(exc).__name__[:4])
    value = ','.join(tried)
    """
    try:
        outcome, _ = score_payload(sheet_item, payload)
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    # The raw connect failed; the audit hook refused the other two.
    assert "pred='c-1,Perm,Perm" in outcome, outcome
    assert accepted == []


def test_the_parents_environment_is_not_readable_through_proc(sheet_item, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", f"sk-{SECRET}")
    monkeypatch.setenv("SKILLOPT_PLANTED_PASSWORD", SECRET)
    payload = f"""
    import os
    blob, read = b'', 0
    pids = {{str(os.getppid()), '1', '{os.getpid()}', '{os.getppid()}'}}
    for pid in pids | set(filter(str.isdigit, os.listdir('/proc'))):
        try:
            blob += open('/proc/%s/environ' % pid, 'rb').read()
            read += 1
        except OSError:
            pass
    value = 'environ:%s:%d' % ('LEAKED' if b'{SECRET}' in blob else 'clean', read)
    """
    outcome, everything = score_payload(sheet_item, payload)
    assert "pred='environ:clean:" in outcome and "environ:clean:0" not in outcome, outcome
    assert "environ:LEAKED" not in everything  # (the script itself, in the trajectory, says LEAKED)


# --------------------------------------------------------------------- processes, through the API


def test_fork_exec_os_fork_and_ctypes_fork_setsid_start_nothing_and_nothing_survives(workspace):
    result = run(
        """
        import ctypes, os, _posixsubprocess
        print('NS=' + os.readlink('/proc/self/ns/pid'))
        libc = ctypes.CDLL(None, use_errno=True)
        started = []
        for _ in range(20):
            pid = libc.fork()
            if pid == 0:
                libc.setsid(); libc.sleep(1000); libc._exit(0)
            started.append(pid)
        print('ctypes fork ->', sorted(set(started)), 'errno', ctypes.get_errno())
        ints = [-1] * 6 + list(os.pipe())  # the std pipe ends, then the error pipe
        tail = [False, False, -1, None, None, None, -1, None, False]  # 3.11-3.12; 3.13 drops allow_vfork
        for extra in (tail, tail[:-1]):
            try:
                sh = [b'/bin/sh']
                pid = _posixsubprocess.fork_exec(sh, sh, True, (), None, None, *ints, *extra)
                print('fork_exec ->', pid)
                break
            except TypeError:
                continue
            except Exception as exc:
                print('fork_exec', type(exc).__name__)
                break
        try:
            print('os.fork ->', os.fork())
        except Exception as exc:
            print('os.fork', type(exc).__name__)
        """,
        workspace,
    )
    assert "ctypes fork -> [-1]" in result.stdout, result.stdout + result.stderr
    assert "fork_exec PermissionError" in result.stdout and "os.fork PermissionError" in result.stdout
    assert_namespace_gone(result.stdout)


def test_daemons_of_a_command_that_may_start_processes_die_with_the_namespace(workspace):
    # Exec targets may start processes (no seccomp filter); a setsid'd daemon still dies with the run.
    marker = f"daemon-{os.getpid()}-{id(workspace)}"
    outcome = run_confined(
        ["/bin/sh", "-c", f"echo NS=$(readlink /proc/self/ns/pid); setsid sh -c 'exec -a {marker} sleep 300' "
                          "</dev/null >/dev/null 2>&1 & sleep 0.3; echo started"],
        workspace=workspace, timeout_s=20, env={"PATH": "/usr/bin:/bin"},
    )
    assert "started" in outcome.stdout, outcome
    assert_namespace_gone(outcome.stdout)


def test_a_fork_bomb_is_contained(workspace):
    result = run(
        """
        import ctypes, os
        print('NS=' + os.readlink('/proc/self/ns/pid'), flush=True)
        libc = ctypes.CDLL(None)
        while True:
            libc.fork()
        """,
        workspace, timeout_s=2,
    )
    assert result.timed_out
    assert_namespace_gone(result.stdout)


def test_memory_exhaustion_is_stopped_by_the_address_space_limit(workspace):
    result = run("""
        import ctypes
        blocks = [bytearray(64 * 1024 * 1024) for _ in range(64)]
        """, workspace, mem_mb=256)
    assert not result.ok and result.killed_for_memory and result.reason.startswith("out of memory:")


def test_cpu_exhaustion_is_stopped_at_the_time_limit(workspace):
    result = run("""
        import os, threading
        print('NS=' + os.readlink('/proc/self/ns/pid'), flush=True)
        def burn():
            while True:
                pass
        for _ in range(4):
            threading.Thread(target=burn, daemon=True).start()
        burn()
        """, workspace, timeout_s=2)
    assert not result.ok and (result.timed_out or result.cpu_limited), result.reason
    assert_namespace_gone(result.stdout)


def test_a_flood_of_stdout_comes_back_cut_with_its_tail(workspace):
    result = run("""
        import sys
        sys.stdout.write('HEAD\\n')
        for _ in range(3000):
            sys.stdout.write('x' * 65536)
        sys.stdout.write('\\nTAIL-LINE\\n')
        """, workspace, timeout_s=30, max_output_chars=5000)
    assert result.ok, result.reason
    assert result.stdout.startswith("HEAD") and result.stdout.rstrip().endswith("TAIL-LINE")
    assert len(result.stdout) < 5200 and "characters cut" in result.stdout
