"""A seccomp filter for grader workers: the system calls that reach past bubblewrap's namespaces fail with EPERM.

Namespaces do not cover two channels a grader could use to reach the host or another bundle's graders:
- kernel keyrings (`add_key`, `request_key`, `keyctl`): the session keyring of whoever started strop, and in a
  root sandbox the user keyring that every grader (all uid 65534) shares;
- unix sockets bound to paths: a network namespace isolates addresses, not files, so any world-writable socket
  the view shows could be connected to. `socket(AF_UNIX, ...)` fails; `socketpair` still makes the connected
  stream pairs Python uses internally (asyncio, multiprocessing), but no datagram pair, since a datagram socket
  can send to any path.
io_uring is refused too: its operations (socket, connect) are not seen by seccomp at all.

The program is classic BPF built here with `struct` (no libseccomp needed) and handed to bwrap as `--seccomp FD`;
bwrap installs it just before it starts the worker, so it binds the worker and all it starts.

    fd = filter_fd()            # None where this architecture has no filter here
    argv = [bwrap, "--seccomp", str(fd), ...]; subprocess.Popen(argv, pass_fds=(fd,)); os.close(fd)
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
NR, ARCH = 0, 4
ARG0, ARG1 = 16, 24  # the low 32 bits of args[0] and args[1] on a little-endian machine (both arches here are)
AF_UNIX = 1
SOCK_TYPE_MASK, SOCK_STREAM, SOCK_SEQPACKET = 0xF, 1, 5
X32_SYSCALL_BIT = 0x40000000

RET_ALLOW = 0x7FFF0000
RET_EPERM = 0x00050000 | errno.EPERM
LD_W_ABS, JEQ_K, JGE_K, AND_K, RET_K = 0x20, 0x15, 0x35, 0x54, 0x06


# audit architecture and the numbers of the calls the filter looks at, per machine
ARCHES = {
    "x86_64": dict(audit=0xC000003E, keyrings=(248, 249, 250), io_uring=(425, 426, 427), socket=41, socketpair=53,
                   x32=True),
    "aarch64": dict(audit=0xC00000B7, keyrings=(217, 218, 219), io_uring=(425, 426, 427), socket=198, socketpair=199,
                    x32=False),
}
ARCHES["amd64"], ARCHES["arm64"] = ARCHES["x86_64"], ARCHES["aarch64"]


def machine() -> dict | None:
    """This machine's entry in ARCHES, or None where strop has no filter for it."""
    return ARCHES.get(platform.machine().lower())


def keyctl_number() -> int | None:
    found = machine()
    return found["keyrings"][2] if found else None


def program(arch: dict) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions. A call from another ABI (32-bit, x32) fails whole: its numbers
    mean other calls."""
    code: list[tuple] = [
        (LD_W_ABS, 0, 0, ARCH),
        (JEQ_K, 0, "deny", arch["audit"]),
        (LD_W_ABS, 0, 0, NR),
    ]
    if arch["x32"]:
        code.append((JGE_K, "deny", 0, X32_SYSCALL_BIT))
    for number in (*arch["keyrings"], *arch["io_uring"]):
        code.append((JEQ_K, "deny", 0, number))
    code += [
        (JEQ_K, "socket", 0, arch["socket"]),
        (JEQ_K, "socketpair", 0, arch["socketpair"]),
        (RET_K, 0, 0, RET_ALLOW),
        ("socket", LD_W_ABS, 0, 0, ARG0),
        (JEQ_K, "deny", 0, AF_UNIX),
        (RET_K, 0, 0, RET_ALLOW),
        ("socketpair", LD_W_ABS, 0, 0, ARG1),
        (AND_K, 0, 0, SOCK_TYPE_MASK),
        (JEQ_K, "allow", 0, SOCK_STREAM),
        (JEQ_K, "allow", 0, SOCK_SEQPACKET),
        ("deny", RET_K, 0, 0, RET_EPERM),
        ("allow", RET_K, 0, 0, RET_ALLOW),
    ]
    return _resolve(code)


def _resolve(code: list[tuple]) -> list[tuple[int, int, int, int]]:
    """Labels (a leading string) and label jumps turned into BPF's relative offsets (from the next instruction)."""
    labels, plain = {}, []
    for index, item in enumerate(code):
        if isinstance(item[0], str):
            labels[item[0]] = index
            item = item[1:]
        plain.append(item)
    out = []
    for index, (op, jt, jf, k) in enumerate(plain):
        jt, jf = (labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256
        out.append((op, jt, jf, k))
    return out


def encode(instructions: list[tuple[int, int, int, int]]) -> bytes:
    """struct sock_filter[]: u16 code, u8 jt, u8 jf, u32 k each, in the machine's byte order (what bwrap reads)."""
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)


def filter_fd() -> int | None:
    """A file descriptor holding this machine's filter, read from its start (bwrap's `--seccomp FD`); the caller
    closes it. None where there is no filter for this architecture or no memfd."""
    arch = machine()
    if arch is None or not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("strop-grader-seccomp")  # close-on-exec: Popen's pass_fds hands it to bwrap alone
    try:
        os.write(fd, encode(program(arch)))
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
