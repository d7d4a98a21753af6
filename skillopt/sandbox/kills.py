"""Why a sandboxed run was stopped: out of memory, a time limit, an output limit or a signal.

The sandbox (:mod:`skillopt.sandbox.confine`) bounds model-written code with rlimits, a seccomp filter, a
wall clock and an output budget. Each bound ends a run its own way — a ``MemoryError``, a SIGSYS
from the filter, a SIGXCPU, an ``EFBIG`` write error, a killed process group — and the optimizer
should be told which one, not "the code crashed". :func:`classify` reads those traces back into one
:class:`Kill`.

Under bubblewrap the namespace's init reports a child killed by signal N as exit code ``128 + N``
(without it, ``subprocess`` reports ``-N``), so an exit code above 128 is read as a signal; a script
that calls ``sys.exit(139)`` itself is indistinguishable from a segmentation fault.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Literal

KillKind = Literal["memory", "time", "output", "signal"]

#: What a Python process, NumPy or glibc writes when an allocation fails.
MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "Unable to allocate")
#: What a write past RLIMIT_FSIZE raises (Python ignores SIGXFSZ, so the write fails with EFBIG).
FILE_TOO_LARGE = "[Errno 27] File too large"
#: The label each kind leads its reason with.
LABELS: dict[KillKind, str] = {"memory": "out of memory", "time": "time limit", "output": "output limit",
                               "signal": "killed by signal"}


@dataclass(frozen=True)
class Kill:
    """One resource kill: its ``kind``, the signal that ended the process (if one did) and a clause
    saying which limit and how it showed."""

    kind: KillKind
    detail: str
    signal: int | None = None

    @property
    def reason(self) -> str:
        """One line: ``out of memory: …``, ``time limit: …``, ``output limit: …`` or
        ``killed by signal SIGSEGV (Segmentation fault)…``."""
        separator = " " if self.kind == "signal" else ": "
        return f"{LABELS[self.kind]}{separator}{self.detail}"


def exit_signal(exit_code: int | None) -> int | None:
    """The signal a run's exit code reports (``-N``, or ``128 + N`` from bubblewrap's init), or None."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 128 + 65 else 0
    return number if number > 0 else None


def signal_name(number: int) -> str:
    """``SIGSEGV (Segmentation fault)``; ``signal 42`` for a number with no name."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    description = signal.strsignal(number) or ""
    return f"{name} ({description})" if description and description != name else name


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def crash_site(stderr: str) -> str:
    """Where the code was when a fatal signal hit, from the traceback Python's ``faulthandler`` printed
    (innermost frame first): the innermost frame of the run's own code (``<string>`` or a workspace
    script, both given by relative names), else the innermost frame; "" without a dump."""
    if "most recent call first" not in stderr:
        return ""
    frames = [found for line in stderr.split("most recent call first", 1)[1].splitlines()
              if (found := _FRAME.match(line))]
    own = next((f for f in frames if not f["file"].startswith("/")), frames[0] if frames else None)
    return f"{own['file']} line {own['line']}" if own else ""


def classify(*, exit_code: int | None, stderr: str, timed_out: bool, output_limited: bool,
             elapsed_s: float, timeout_s: float, cpu_s: int, mem_mb: int, max_output_bytes: int | None,
             file_bytes: int, memory_filter: bool) -> Kill | None:
    """The resource kill that ended a run, or None when it exited on its own (0 or an ordinary error).

    ``memory_filter`` says the seccomp filter that kills oversized allocations with SIGSYS was loaded.
    Checked in this order: the wall clock, the output budget, the filter's SIGSYS, SIGXCPU, the file
    size limit (SIGXFSZ or ``EFBIG``), a memory error in stderr, then any other signal.
    """
    if timed_out:
        return Kill("time", f"the {timeout_s:g} s wall-clock limit was reached after {elapsed_s:.1f} s; "
                            "the process group was killed")
    if output_limited:
        limit = f"{max_output_bytes / 2**20:g} MiB" if max_output_bytes is not None else "its limit"
        return Kill("output", f"stdout and stderr passed {limit}; the process group was killed")
    if exit_code == 0:
        return None
    number = exit_signal(exit_code)
    if number == signal.SIGSYS and memory_filter:
        return Kill("memory", f"the code asked for one block of memory larger than the whole {mem_mb} MiB "
                              "limit; the sandbox killed it", number)
    if number == signal.SIGXCPU:
        return Kill("time", f"the {cpu_s} s CPU-time limit was reached", number)
    if number == signal.SIGXFSZ or FILE_TOO_LARGE in stderr:
        return Kill("output", f"a file grew past the {file_bytes // 2**20} MiB file-size limit", number)
    marker = next((m for m in MEMORY_MARKERS if m in stderr), None)
    if marker is not None:
        return Kill("memory", f"the {mem_mb} MiB memory limit was reached ({marker})", number)
    if number is not None:
        return Kill("signal", signal_name(number), number)
    return None


__all__ = ["FILE_TOO_LARGE", "LABELS", "MEMORY_MARKERS", "Kill", "KillKind", "classify", "crash_site",
           "exit_signal", "signal_name"]
