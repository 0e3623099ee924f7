#!/usr/bin/env python3
"""NVIDIA's CUDA compiler pieces from PyPI, to compile the kernels to PTX and CUBIN without a GPU or a
CUDA install: NVRTC (libnvrtc), the CUDA headers, and cuobjdump, which reads a CUBIN's registers and
shared memory (the independent check of Piper's own reader). Python's standard library only: each wheel
(a zip file) is pinned by version and SHA-256, downloaded from PyPI's index and unpacked once into DIR.

Usage: eval "$(scripts/cuda-tools.py DIR)"   sets PIPER_NVRTC, PIPER_CUDA_INCLUDE and PIPER_CUOBJDUMP.
"""
import hashlib
import json
import os
import sys
import urllib.parse
import urllib.request
import zipfile

# (project, version, sha256 of its manylinux x86-64 wheel)
WHEELS = [
    ("nvidia-cuda-nvrtc-cu12", "12.9.86", "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4"),
    ("nvidia-cuda-runtime-cu12", "12.9.79", "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3"),
    ("nvidia-cuda-cuobjdump", "13.5.37", "38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58"),
]
INDEX = os.environ.get("PIPER_PYPI_JSON", "https://pypi.org/pypi")


def fetch(project, version, sha256, into):
    done = os.path.join(into, f".{project}-{version}")
    if os.path.exists(done):
        return
    meta_url = f"{INDEX}/{project}/json"
    meta = json.load(urllib.request.urlopen(meta_url, timeout=60))
    files = [f for f in meta["releases"].get(version, []) if f["digests"]["sha256"] == sha256]
    if not files:
        sys.exit(f"error: {project} {version} with SHA-256 {sha256} is not on {meta_url}")
    url = urllib.parse.urljoin(meta_url, files[0]["url"])
    wheel = os.path.join(into, files[0]["filename"])
    print(f"downloading {files[0]['filename']} ({files[0]['size'] / 1e6:.0f} MB)", file=sys.stderr)
    urllib.request.urlretrieve(url, wheel)
    with open(wheel, "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    if got != sha256:
        os.remove(wheel)
        sys.exit(f"error: {wheel} has SHA-256 {got}, not {sha256}")
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = z.extract(info, into)
            if (info.external_attr >> 16) & 0o111 or "/bin/" in info.filename:
                os.chmod(path, 0o755)
    os.remove(wheel)
    open(done, "w").close()


def find(root, name):
    for folder, _, files in os.walk(root):
        if name in files:
            return os.path.join(folder, name)
    sys.exit(f"error: no {name} under {root}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    into = os.path.abspath(sys.argv[1])
    os.makedirs(into, exist_ok=True)
    for project, version, sha256 in WHEELS:
        fetch(project, version, sha256, into)
    print(f"export PIPER_NVRTC={find(into, 'libnvrtc.so.12')}")
    print(f"export PIPER_CUDA_INCLUDE={os.path.dirname(find(into, 'cuda_fp16.h'))}")
    print(f"export PIPER_CUOBJDUMP={find(into, 'cuobjdump')}")


if __name__ == "__main__":
    main()
