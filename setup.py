"""The native build, asked for with `SANGAM_NATIVE=1 pip install ...`: mypyc compiles the simulator's hot
modules (`runs.build.NATIVE_MODULES`), so a simulated point runs in about half the time, and records the
hash of each source it compiled. Asked for and impossible (no C compiler), the install fails. Without
`SANGAM_NATIVE` (or with 0) nothing is compiled, and a native build left from an earlier install is
removed, so the modules run as Python."""

import json
import os
import runpy

from setuptools import setup
from setuptools.command.build_ext import build_ext

BUILD = runpy.run_path(os.path.join("runs", "build.py"))
CHOICE = os.environ.get("SANGAM_NATIVE", "")
if CHOICE not in ("", "0", "1"):
    raise SystemExit(f"SANGAM_NATIVE={CHOICE!r}: use 1 for the native build, 0 or nothing for Python")
NATIVE = CHOICE == "1"


class NativeBuild(build_ext):
    """Builds the extensions, then records the hashes of their sources (`runs/native.json`)."""

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return  # the Python build: no manifest, or a later edit would be refused as a stale build
        hashes = {m: BUILD["source_hash"](m, BUILD["ROOT"]) for m in BUILD["NATIVE_MODULES"]}
        target = "runs" if self.inplace else os.path.join(self.build_lib, "runs")
        with open(os.path.join(target, "native.json"), "w") as f:
            json.dump(hashes, f, indent=1, sort_keys=True)


def extensions() -> list:
    if not NATIVE:
        for path in BUILD["built_files"](BUILD["ROOT"]):
            path.unlink()  # an earlier native build would otherwise still be imported
        return []
    from mypyc.build import mypycify

    paths = [os.path.join(*m.split(".")) + ".py" for m in BUILD["NATIVE_MODULES"]]
    return mypycify(paths, group_name="sangam_native")


setup(ext_modules=extensions(), cmdclass={"build_ext": NativeBuild})
