"""Builds the simulator's compiled modules as the package is installed (``pearl.native``).

Everything else about the package is in pyproject.toml. ``build_py`` runs for a wheel and,
with ``editable_mode`` set, for an editable install (setuptools' documented hook for build
steps): the build goes into the wheel's package folder, or into ``src/pearl`` in place. A
machine without a C compiler still installs, and simulates on the Python modules.
"""

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

PACKAGE = Path(__file__).resolve().parent / "src" / "pearl"


def _native():
    """``pearl.native`` on its own (it imports nothing of pearl's), without importing pearl."""
    spec = importlib.util.spec_from_file_location("_pearl_native_build", PACKAGE / "native.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class BuildPyWithCompiledModules(build_py):
    def run(self):
        super().run()
        if os.environ.get("PEARL_NATIVE") == "0":
            return
        native = _native()
        into = PACKAGE if self.editable_mode else Path(self.build_lib) / "pearl"
        try:
            folder = native.build(PACKAGE, into)
        except (native.NativeBuildError, OSError) as exc:  # the install goes on without them
            print(f"[pearl] compiled modules not built, simulations run Python: {exc}")
            return
        print(f"[pearl] compiled modules: {folder}")


class CompiledDistribution(Distribution):
    def has_ext_modules(self):
        return True  # the wheel holds extensions: tagged for this interpreter and platform


setup(cmdclass={"build_py": BuildPyWithCompiledModules}, distclass=CompiledDistribution)
