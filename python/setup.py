"""Build of the tpk Python package from a tpk checkout (python/ inside it).

build_ext runs `make -C <checkout> <build>/lib/libtpk.a` (a no-op when the library is up to date),
asks make for the libraries libtpk needs (`make python-link-flags`), and builds the cffi module
tpk._native with libtpk.a linked in statically. build_py copies the shipped NETSOR programs and
demo inputs into tpk/share/, so the installed package needs neither the checkout nor its build
tree. TPK_BUILD picks the checkout's build folder (default: build), MAKE the make program.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.command.build_py import build_py as _build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = os.environ.get("TPK_BUILD", "build")
MAKE = os.environ.get("MAKE", "make")


def _checkout():
    if not (ROOT / "Makefile").is_file() or not (ROOT / "include" / "tpk" / "error.h").is_file():
        sys.exit(f"tpk: {HERE} is not inside a tpk checkout (no {ROOT}/Makefile, "
                 f"{ROOT}/include/tpk); install with `pip install ./python` from a checkout")
    return ROOT


def _make(*args, capture=False):
    cmd = [MAKE, "-C", str(_checkout()), f"BUILD={BUILD}", *args]
    print("tpk:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    if capture:
        return subprocess.run(cmd + ["-s"], check=True, stdout=subprocess.PIPE, text=True).stdout
    jobs = os.environ.get("TPK_JOBS", "2")
    subprocess.run(cmd + [f"-j{jobs}"], check=True)
    return None


class build_ext(_build_ext):
    """The cffi module: its C source emitted by cffi, compiled against include/ and linked
    with libtpk.a (made first)."""

    def finalize_options(self):
        sys.path.insert(0, str(HERE))
        from _ffi_build import make_ffi

        lib = ROOT / BUILD / "lib" / "libtpk.a"
        _make(f"{BUILD}/lib/libtpk.a")
        link = shlex.split(_make("python-link-flags", capture=True).strip().splitlines()[-1])
        ffi, kw = make_ffi(str(ROOT / "include"), str(lib), link)
        gen = HERE / "build" / "cffi"
        gen.mkdir(parents=True, exist_ok=True)
        src = gen / "_native.c"
        ffi.emit_c_code(str(src))
        self.distribution.ext_modules = [
            Extension("tpk._native", sources=[os.path.relpath(src, HERE)], depends=[str(lib)], **kw)]
        super().finalize_options()


class build_py(_build_py):
    def run(self):
        super().run()
        share = Path(self.build_lib) / "tpk" / "share"
        for sub, pattern in (("programs", "*.nsr"), ("data", "demo-*")):
            (share / sub).mkdir(parents=True, exist_ok=True)
            for f in sorted((_checkout() / sub).glob(pattern)):
                shutil.copy2(f, share / sub / f.name)


setup(
    # a placeholder: build_ext replaces it by the cffi module (it makes the wheel platform-specific)
    ext_modules=[Extension("tpk._native", sources=[])],
    cmdclass={"build_ext": build_ext, "build_py": build_py},
)
