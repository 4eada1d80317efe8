"""The compiled part of records-gateway (everything else is in pyproject.toml).

gateway/normalise/compiled.pyx is Cython: the compiled twin of the normalise step's
record rules, translated to C by the build (Cython is a build requirement in
pyproject.toml) and compiled with the machine's C compiler. It is optional: where the C
build fails (no compiler, no Python headers) the install goes on without it, and the
pure-Python rules, which are the reference, run with the same results
(gateway.normalise.rules decides).
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILED = "gateway.normalise.compiled"


class BuildExt(build_ext):
    """build_ext that says when the optional module was left out, and, in an editable
    install, removes the module a previous build left in the source tree: that one was
    compiled from another source, and would run in place of the Python rules."""

    def copy_extensions_to_source(self) -> None:
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            fullname = self.get_ext_fullname(ext.name)
            filename = self.get_ext_filename(fullname)
            if not ext.optional or os.path.exists(os.path.join(self.build_lib, filename)):
                continue
            package_dir = build_py.get_package_dir(fullname.rpartition(".")[0])
            stale = os.path.join(package_dir, os.path.basename(filename))
            if os.path.exists(stale):
                self.warn(f"removing {stale}: {ext.name} was not built again")
                os.remove(stale)
        super().copy_extensions_to_source()

    def run(self) -> None:
        super().run()
        built = os.path.join(self.build_lib, self.get_ext_filename(COMPILED))
        if not os.path.exists(built) and not self.dry_run:
            self.warn(
                f"{COMPILED} was not built (a C compiler and Python's headers are needed);"
                " the pure-Python rules will run, with the same results, slower"
            )


extensions = cythonize(
    [Extension(COMPILED, ["gateway/normalise/compiled.pyx"])],
    compiler_directives={"language_level": "3"},
)
for extension in extensions:
    # set here, not as Extension(optional=True): cythonize makes new Extensions and
    # does not carry that over
    extension.optional = True

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
