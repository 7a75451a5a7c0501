"""A PEP 517 build backend of a few lines, so that ``pip install
clients/python`` works offline: pip's build isolation would otherwise
fetch setuptools from PyPI.  It writes a pure-Python wheel (the files of
dlock/ and the .dist-info with METADATA, WHEEL and RECORD) and an sdist;
the metadata are read from pyproject.toml (tomllib, Python 3.11+; a
minimal reader of the few keys used otherwise).
"""
import base64
import hashlib
import io
import os
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "dlock"


def _project():
    path = os.path.join(ROOT, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        pass
    # the keys this file uses, in the form it writes them
    proj, section = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
                continue
            if section == "project" and "=" in line:
                k, v = (s.strip() for s in line.split("=", 1))
                if v.startswith('"'):
                    proj[k] = v.strip('"')
                elif v.startswith("["):
                    proj[k] = [s.strip().strip('"') for s in v.strip("[]").split(",") if s.strip()]
    return proj


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"],
             "Summary: " + p.get("description", "")]
    if "requires-python" in p:
        lines.append("Requires-Python: " + p["requires-python"])
    for dep in p.get("dependencies", []):
        lines.append("Requires-Dist: " + dep)
    for extra, deps in p.get("optional-dependencies", {}).items() if isinstance(p.get("optional-dependencies"), dict) else []:
        lines.append("Provides-Extra: " + extra)
        for dep in deps:
            lines.append('Requires-Dist: %s ; extra == "%s"' % (dep, extra))
    body = ""
    readme = os.path.join(ROOT, "README.md")
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return p, "\n".join(lines) + "\n" + body


def _package_files():
    pkg = os.path.join(ROOT, NAME)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            yield os.path.join(pkg, name), NAME + "/" + name


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _wheel_name(p):
    return "%s-%s-py3-none-any.whl" % (p["name"], p["version"])


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p, metadata = _metadata()
    distinfo = "%s-%s.dist-info" % (p["name"], p["version"])
    wheel = "Wheel-Version: 1.0\nGenerator: dlock_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = []
    for path, arc in _package_files():
        with open(path, "rb") as f:
            entries.append((arc, f.read()))
    entries.append((distinfo + "/METADATA", metadata.encode()))
    entries.append((distinfo + "/WHEEL", wheel.encode()))
    record = [_record_line(a, d) for a, d in entries] + [distinfo + "/RECORD,,"]
    entries.append((distinfo + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = _wheel_name(p)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    p, _ = _metadata()
    base = "%s-%s" % (p["name"], p["version"])
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/dlock_build.py"]:
            if os.path.exists(os.path.join(ROOT, rel)):
                t.add(os.path.join(ROOT, rel), base + "/" + rel)
        for path, arc in _package_files():
            t.add(path, base + "/" + arc)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []
