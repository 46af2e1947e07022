"""The seccomp filter of the python tool's ``bwrap`` sandbox: system calls model-written code has no use for answer
``EPERM``, whatever the code does to the Python around it.

bwrap loads the filter (``--seccomp FD``) as the last step before it starts the interpreter, so the filter binds the
interpreter and everything it could start, and no Python-level trick can remove it: a filter can only be added to,
never lifted. The program is classic BPF over ``struct seccomp_data`` (``nr`` at byte 0, ``arch`` at 4, the
arguments from 16 on), packed here with :mod:`struct`: there is nothing to compile and no libseccomp to install.

What it refuses, and why each:

- **Other processes' memory and state**: ``ptrace``, ``process_vm_readv``/``writev``, ``process_madvise``,
  ``kcmp``, ``pidfd_open``/``pidfd_send_signal``/``pidfd_getfd`` (the PID namespace already hides every outside
  process; this also closes the paths an issue-46 escape used).
- **New namespaces and mounts** (the way out of, or around, the sandbox's own): ``unshare``, ``setns``, ``clone``
  with any namespace flag, ``mount``, ``umount2``, ``pivot_root``, ``chroot``, the new mount API (``fsopen`` ...
  ``mount_setattr``, ``open_tree``, ``move_mount``), ``open_by_handle_at``/``name_to_handle_at`` (a file by its
  handle, past any mount: the classic container escape).
- **New processes**: ``fork``, ``vfork``, and ``clone`` without ``CLONE_THREAD`` (threads stay allowed): the
  sandbox runs one process, as the old sandbox's ``RLIMIT_NPROC`` meant to, which the kernel does not apply to
  root. ``clone3`` answers ``ENOSYS`` (its flags sit in memory a filter cannot read), so the C library falls back to
  ``clone``, whose flags the filter reads.
- **Kernel attack surface** the interpreter never touches: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_*``, ``keyctl``/``add_key``/``request_key``, ``kexec_*``, ``init_module``/``finit_module``/
  ``delete_module``, ``reboot``, ``swapon``/``swapoff``, ``acct``, ``quotactl``, ``syslog``, ``lookup_dcookie``,
  ``settimeofday``/``clock_settime``/``clock_adjtime``/``adjtimex``, ``vhangup``, and on x86-64 ``iopl``,
  ``ioperm``, ``modify_ldt`` and ``uselib``.
- **Another ABI**: a call made with an architecture other than the interpreter's (32-bit ``int 0x80`` on x86-64),
  or through the x32 ABI, would be looked up in another table of numbers: it is refused whole.
"""
from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass
from typing import Dict, List, Tuple

# Refused everywhere (a name an architecture lacks is skipped there).
DENIED: Tuple[str, ...] = (
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    "fork", "vfork",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "lookup_dcookie",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "vhangup", "iopl", "ioperm", "modify_ldt", "uselib",
)

CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


@dataclass(frozen=True)
class Arch:
    audit: int
    """``AUDIT_ARCH_*``: what the kernel puts in ``seccomp_data.arch`` for a call of this ABI."""
    numbers: Dict[str, int]
    """System call numbers (``asm/unistd_64.h``; ``asm-generic/unistd.h`` for aarch64)."""
    x32: bool = False
    """Numbers from ``0x40000000`` on are the x32 ABI's, refused (x86-64 only)."""


ARCHES: Dict[str, Arch] = {
    "x86_64": Arch(0xC000003E, x32=True, numbers={
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "process_madvise": 440, "kcmp": 312,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "unshare": 272, "setns": 308,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169,
        "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "syslog": 103, "lookup_dcookie": 212,
        "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "vhangup": 153,
        "iopl": 172, "ioperm": 173, "modify_ldt": 154, "uselib": 134}),
    "aarch64": Arch(0xC00000B7, numbers={
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "process_madvise": 440, "kcmp": 272,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "unshare": 97, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "clone": 220, "clone3": 435,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142,
        "swapon": 224, "swapoff": 225, "acct": 89, "quotactl": 60, "syslog": 116, "lookup_dcookie": 18,
        "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "vhangup": 58}),
}

# classic BPF opcodes and seccomp's return values
_LOAD_WORD, _JEQ, _JGE, _JSET, _RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data; both arches are little-endian


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> Tuple[int, int, int, int]:
    return code, jt, jf, k


def program(machine: str = "", denied: Tuple[str, ...] = DENIED) -> bytes:
    """The filter for ``machine`` (default: this one's), as bwrap reads it: one ``struct sock_filter`` after another.
    ``clone`` without ``CLONE_THREAD`` is a fork: refused with ``fork`` (tests deny less, to show what the other
    layers stop on their own)."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        raise ValueError(f"no seccomp filter for {machine or platform.machine()}: mindgrpo has the system call "
                         f"numbers of {', '.join(ARCHES)}")
    refuse = _op(_RETURN, _ERRNO | errno.EPERM)
    ops: List[Tuple[int, int, int, int]] = [_op(_LOAD_WORD, _ARCH), _op(_JEQ, arch.audit, jt=1), refuse,
                                            _op(_LOAD_WORD, _NR)]
    if arch.x32:
        ops += [_op(_JGE, 0x40000000, jf=1), refuse]
    for name in denied:
        if name in arch.numbers:
            ops += [_op(_JEQ, arch.numbers[name], jf=1), refuse]
    ops += [_op(_JEQ, arch.numbers["clone3"], jf=1), _op(_RETURN, _ERRNO | errno.ENOSYS)]
    clone = [_op(_LOAD_WORD, _ARG0_LOW)]
    if "fork" in denied:
        clone += [_op(_JSET, CLONE_THREAD, jt=1), refuse]
    clone += [_op(_JSET, CLONE_NAMESPACES, jf=1), refuse]
    ops += [_op(_JEQ, arch.numbers["clone"], jf=len(clone))] + clone + [_op(_RETURN, _ALLOW)]
    return b"".join(struct.pack("=HBBI", *op) for op in ops)
