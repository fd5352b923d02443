"""Build a C/C++ shared library once and cache it by the hash of everything that shapes its bits.

Used by the cpu backend (C) and the Ascend C host emulation (C++).  The cache
key covers the sources, headers, flags and compiler version, so a changed
kernel is never served from a stale library.  Builds go to a temporary name
and are renamed into place, so concurrent processes never load half a file.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# -ffp-contract=off: a*b+c must stay two roundings; the canonical order forbids FMA contraction.
# No -ffast-math and no -march=native: the bits must not depend on the build machine.
COMMON_FLAGS = ("-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared")


def cache_dir() -> Path:
    root = os.environ.get("BITPARITY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bitparity")
    return Path(root)


def compiler_version(compiler: str) -> str:
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def find_compiler(name: str) -> str | None:
    return shutil.which(name)


def build_shared_library(name: str, compiler: str, sources: list[Path], headers: list[Path],
                         flags: tuple[str, ...]) -> Path:
    """Compile sources into lib<name>-<hash>.so under cache_dir() unless it is already there."""
    all_flags = COMMON_FLAGS + tuple(flags)
    digest = hashlib.sha256()
    digest.update(compiler_version(compiler).encode())
    digest.update(" ".join(all_flags).encode())
    for path in sorted(sources) + sorted(headers):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    target = cache_dir() / f"lib{name}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    include_dirs = sorted({f"-I{h.parent}" for h in headers})
    cmd = [compiler, *all_flags, *include_dirs, *map(str, sources), "-o", tmp]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building {name} failed:\n{' '.join(cmd)}\n{result.stderr}")
    os.replace(tmp, target)
    return target
