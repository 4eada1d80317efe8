"""The compiled part of records-gateway (everything else is in pyproject.toml).

gateway/normalise/compiled.pyx is Cython: the record canonicaliser of the normalise step,
compiled to C by the build (Cython is a build requirement in pyproject.toml) and built
with the machine's C compiler.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("gateway.normalise.compiled", ["gateway/normalise/compiled.pyx"])],
        compiler_directives={"language_level": "3"},
    )
)
