"""`spyreshim snapshot PID`: the live allocations of a running process under
the shim, asked on its control socket (SPYRESHIM_CONTROL=1,
shim/leak/control.c) and written as a leak report (docs/report-format.md,
`reason` "snapshot"), which `spyreshim report` and `report --diff` read.

The socket is abstract, "spyreshim-control.PID"; this side checks, with the
kernel's credentials of the listening end (SO_PEERCRED), that it belongs to
PID and to this user before it asks. Owns the client side of that protocol
only: one request line ("snapshot"), one answer line ("ok ..." with the
figures, or "error: ..."), then the JSON. Errors are UsageError (one line,
status 2).
"""

import json
import os
import socket
import struct
import time

ADDRESS = "\0spyreshim-control.%d"
LIBNAME = "libspyreshim.so"


class SnapshotError(Exception):
    pass


def _under_shim(pid):
    """True when libspyreshim.so is mapped in PID; None when that cannot be
    read."""
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            return any(LIBNAME.encode() in line for line in f)
    except OSError:
        return None


def _check_process(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise SnapshotError("snapshot: no process %d" % pid)
    except PermissionError:
        raise SnapshotError("snapshot: process %d belongs to another user (only its own user "
                            "may ask)" % pid)
    under = _under_shim(pid)
    if under is None:
        raise SnapshotError("snapshot: cannot read /proc/%d/maps (another user's process?)" % pid)
    if not under:
        raise SnapshotError("snapshot: process %d is not under the shim (%s is not loaded)"
                            % (pid, LIBNAME))


def _connect(pid, timeout):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(ADDRESS % pid)
    except (ConnectionRefusedError, FileNotFoundError):
        s.close()
        raise SnapshotError("snapshot: process %d runs under the shim but is not listening "
                            "(start it with SPYRESHIM_CONTROL=1, or `spyreshim run --control`)"
                            % pid)
    except socket.timeout:
        s.close()
        raise SnapshotError("snapshot: process %d did not accept within %g s" % (pid, timeout))
    except OSError as e:
        s.close()
        raise SnapshotError("snapshot: cannot reach process %d: %s" % (pid, e.strerror or e))
    # The abstract namespace has no permissions: anyone could have taken
    # the name first. The kernel says who listens.
    peer_pid, peer_uid, _gid = struct.unpack("3i", s.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if peer_pid != pid or peer_uid != os.geteuid():
        s.close()
        raise SnapshotError("snapshot: the control socket of process %d is held by process %d "
                            "(uid %d), not by it: refusing" % (pid, peer_pid, peer_uid))
    return s


def _read_all(s, pid, deadline):
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        s.settimeout(left)
        b = s.recv(1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def take(pid, timeout=10.0):
    """Asks process PID; returns (figures dict, JSON text)."""
    _check_process(pid)
    deadline = time.monotonic() + timeout
    s = _connect(pid, timeout)
    try:
        s.sendall(b"snapshot\n")
        data = _read_all(s, pid, deadline)
    except socket.timeout:
        raise SnapshotError("snapshot: process %d did not answer within %g s" % (pid, timeout))
    except OSError as e:
        raise SnapshotError("snapshot: process %d: %s" % (pid, e.strerror or e))
    finally:
        s.close()
    head, _, body = data.partition(b"\n")
    line = head.decode("utf-8", "replace")
    if line.startswith("error: "):
        raise SnapshotError("snapshot: process %d: %s" % (pid, line[len("error: "):]))
    fields = line.split()
    if fields[:3] != ["ok", "spyreshim-snapshot", "1"]:
        raise SnapshotError("snapshot: process %d answered something else (%r)"
                            % (pid, line[:80]))
    figures = {}
    for f in fields[3:]:
        k, _, v = f.partition("=")
        if v.isdigit():
            figures[k] = int(v)
    if "length" in figures and figures["length"] != len(body):
        raise SnapshotError("snapshot: process %d: the answer was cut (%d of %d bytes)"
                            % (pid, len(body), figures["length"]))
    text = body.decode("utf-8")
    try:
        json.loads(text)
    except ValueError as e:
        raise SnapshotError("snapshot: process %d: the report is not JSON (%s)" % (pid, e))
    return figures, text


def write(path, text):
    """The report file, created 0600 as the shim's own (never through a
    symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise SnapshotError("snapshot: cannot write %s: %s" % (path, e.strerror or e))
