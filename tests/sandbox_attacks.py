"""What tests/test_sandbox*.py share: the issue-46 ways to switch the python tool's audit hook off from inside, and a
way to find processes a sandboxed program left behind.

The hook runs inside the process it polices, so model-written code can switch it off; these preludes do it the two
ways issue 46 did. Code run after one meets the kernel's layers alone: what it then cannot do, the hook was not
needed for.
"""
import os
from typing import List

# Its policy lives in the interpreter's __main__: replace the path check and empty the denied events.
UNHOOK_MAIN = '''
import sys as _sys
_main = _sys.modules["__main__"]
_main.inside = lambda path, roots: True
_main.DENIED = _main.WRITES = _main.READS = ()
'''

# Find the hook function among the garbage collector's objects and replace its code with a no-op.
UNHOOK_GC = '''
import gc as _gc
for _f in _gc.get_objects():
    if type(_f).__name__ == "function" and _f.__name__ == "hook" and _f.__code__.co_filename == "<string>":
        _f.__code__ = (lambda event, args: None).__code__
'''

PRELUDES = {"hook on": "", "hook off (__main__)": UNHOOK_MAIN, "hook off (gc)": UNHOOK_GC}

# Each step of an attack runs through attempt(): "DONE <value>" when the call went through (a step that can only go
# through by escaping), else the error's class and errno, so a test reads which layer answered (PermissionError from
# the hook, EPERM/ENOENT/EROFS from the kernel). look() runs a step that may go through inside the sandbox (listing a
# folder): "SEEN <value>", judged by what the value shows.
ATTEMPT = '''
def attempt(label, action, went="DONE"):
    try:
        value = action()
    except BaseException as err:
        print(label, type(err).__name__, getattr(err, "errno", ""), flush=True)
    else:
        print(label, went, repr(value)[:300], flush=True)

def look(label, action):
    attempt(label, action, "SEEN")
'''


def processes_named(marker: str) -> List[int]:
    """Processes of this machine whose name (``/proc/PID/comm``, which a process may set for itself) starts with
    ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as comm:
                    if comm.read().startswith(marker):
                        found.append(int(pid))
            except OSError:  # gone meanwhile
                pass
    return found
