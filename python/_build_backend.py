"""A PEP 517 build backend for the flashoverlap package, in the standard
library alone, so that `pip install --no-build-isolation --no-deps ./python`
works offline in a bare venv (no setuptools or wheel to fetch).

The wheel holds flashoverlap/*.py and a copy of libflashoverlap.so as
flashoverlap/lib/libflashoverlap.so: the installed package loads the
library it was installed with (FLASHOVERLAP_LIBRARY overrides it at run
time). The library is found, at build time, as library() says. The wheel's
tag is py3-none-<platform>: any Python 3 (ctypes, no extension module), one
platform (the .so).

An editable install (pip install -e ./python) puts this directory on
sys.path and bundles nothing: the package then finds the library through
FLASHOVERLAP_LIBRARY or the source checkout's build/src/api/.
"""

import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))  # python/ (or <prefix>/python)
NAME = "flashoverlap"
LIB = "libflashoverlap.so"
SUMMARY = ("FlashOverlap: a Hopper GEMM overlapped with the NCCL AllReduce, ReduceScatter or MoE All-to-All after it, "
           "for PyTorch (ctypes over the C ABI)")


def version():
    with open(os.path.join(HERE, NAME, "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def library():
    """The libflashoverlap.so to bundle: $FLASHOVERLAP_LIBRARY, else the
    repository's build (<repo>/build/src/api/, python/ being <repo>/python),
    else an install prefix's (<prefix>/lib*/, python/ being <prefix>/python,
    where `cmake --install` puts it)."""
    env = os.environ.get("FLASHOVERLAP_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"FLASHOVERLAP_LIBRARY={env}: no such file")
        return os.path.realpath(env)
    parent = os.path.dirname(HERE)
    libdirs = ["lib", "lib64"]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        libdirs.append(os.path.join("lib", multiarch))
    candidates = [os.path.join(parent, "build", "src", "api", LIB)] + [os.path.join(parent, d, LIB) for d in libdirs]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.realpath(c)
    raise RuntimeError(f"{LIB} not found: build the library first (scripts/build.sh) or set FLASHOVERLAP_LIBRARY "
                       f"to it; looked at {', '.join(candidates)}")


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version()}\nSummary: {SUMMARY}\n"
            "Requires-Python: >=3.8\nProvides-Extra: torch\nRequires-Dist: torch>=2.4; extra == \"torch\"\n")


def _tag():
    return "py3-none-" + re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


class _Wheel:
    """A wheel being written: files, then the dist-info with its RECORD."""

    def __init__(self, directory):
        self.name = f"{NAME}-{version()}-{_tag()}.whl"
        self.zip = zipfile.ZipFile(os.path.join(directory, self.name), "w", zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self):
        info = f"{NAME}-{version()}.dist-info"
        self.add(f"{info}/METADATA", _metadata().encode())
        self.add(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: {NAME}-build-backend\n"
                                  f"Root-Is-Purelib: false\nTag: {_tag()}\n".encode())
        self.add(f"{info}/top_level.txt", f"{NAME}\n".encode())
        self.record.append(f"{info}/RECORD,,")
        self.zip.writestr(f"{info}/RECORD", "\n".join(self.record) + "\n")
        self.zip.close()
        return self.name


def _sources():
    """The package's .py files, relative to HERE, sorted."""
    for root, dirs, files in os.walk(os.path.join(HERE, NAME)):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "lib"))
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.relpath(os.path.join(root, f), HERE)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    lib = library()
    w = _Wheel(wheel_directory)
    for rel in _sources():
        with open(os.path.join(HERE, rel), "rb") as f:
            w.add(rel.replace(os.sep, "/"), f.read())
    with open(lib, "rb") as f:
        w.add(f"{NAME}/lib/{LIB}", f.read(), 0o755)
    return w.close()


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    w = _Wheel(wheel_directory)
    w.add(f"_{NAME}_editable.pth", (HERE + "\n").encode())
    return w.close()


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in ["pyproject.toml", "_build_backend.py"] + list(_sources()):
            tar.add(os.path.join(HERE, rel), f"{base}/{rel}")
        data = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []
