"""Package discovery: hma/ is the package; probes/ installs as its subpackage hma.probes (the one
mapping, ``package_dir`` in setup.cfg). Every folder with an ``__init__.py`` is found here."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["hma", "hma.*"])
    + ["hma." + name for name in find_packages(include=["probes", "probes.*"])],
)
