#!/usr/bin/env python3
"""Finds (--list) or copies (--copy OUTDIR) the libraries a wheel carries
for the leak check: libunwind.so.8, as the C compiler's linker would find
it, and what it needs beyond glibc (Debian's needs liblzma.so.5). Each copy
gets RUNPATH $ORIGIN, so that its own dependencies come from the same
folder; bundled-libraries.txt names where each came from, with the
packages' copyright files where the system has them (libunwind is MIT,
liblzma public domain/0BSD: both ask for the notice to travel).

Usage: bundle.py --list CC [CC-ARGS...]
       bundle.py --copy OUTDIR CC [CC-ARGS...]
A missing library is one line on stderr and exit status 1."""
import os
import re
import shutil
import subprocess
import sys

ROOT = "libunwind.so.8"
# glibc's own objects: every manylinux system has them.
GLIBC = re.compile(r"^(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux[-\w]*)\.so")
NOTES = "bundled-libraries.txt"


def find(cc, soname):
    r = subprocess.run(cc + ["-print-file-name=" + soname], capture_output=True, text=True)
    path = r.stdout.strip()
    if r.returncode != 0 or not os.path.isabs(path) or not os.path.isfile(path):
        raise LookupError("%s not found by %s (Debian: apt-get install libunwind-dev)"
                          % (soname, " ".join(cc)))
    return os.path.realpath(path)


def needed(path):
    r = subprocess.run(["patchelf", "--print-needed", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise LookupError("patchelf --print-needed %s: %s" % (path, r.stderr.strip()))
    return [n for n in r.stdout.split() if not GLIBC.match(n)]


def closure(cc):
    """[(soname, path)], libunwind first, each dependency once."""
    out, todo = [], [ROOT]
    while todo:
        name = todo.pop(0)
        if any(n == name for n, _ in out):
            continue
        path = find(cc, name)
        out.append((name, path))
        todo += needed(path)
    return out


def copyright_of(path):
    """The Debian copyright file of the package that ships `path`, if any."""
    # A merged /usr: dpkg may know the file by its /lib name.
    for p in (path, path[4:] if path.startswith("/usr/lib/") else None):
        r = subprocess.run(["dpkg-query", "-S", p], capture_output=True,
                           text=True) if p else None
        if r is not None and r.returncode == 0:
            break
    else:
        return None, None
    pkg = r.stdout.split(":")[0].strip()
    f = "/usr/share/doc/%s/copyright" % pkg
    return pkg, (f if os.path.isfile(f) else None)


def main(argv):
    try:
        if len(argv) >= 2 and argv[0] == "--list":
            libs = closure(argv[1:])
            print(" ".join([n for n, _ in libs] + [NOTES]))
            return 0
        if len(argv) >= 3 and argv[0] == "--copy":
            outdir, cc = argv[1], argv[2:]
            notes = ["Shared libraries carried by this wheel for spyreshim's leak check "
                     "(dlopen()ed by libspyreshim.so through its RUNPATH):", ""]
            for name, path in closure(cc):
                dst = os.path.join(outdir, name)
                shutil.copyfile(path, dst)
                os.chmod(dst, 0o755)
                subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", dst], check=True)
                pkg, cr = copyright_of(path)
                notes.append("%s: copied from %s%s" % (name, path, " (Debian package %s)" % pkg
                                                       if pkg else ""))
                if cr:
                    with open(cr, encoding="utf-8", errors="replace") as f:
                        notes += ["", "---- %s ----" % cr, f.read().rstrip(), ""]
            with open(os.path.join(outdir, NOTES), "w", encoding="utf-8") as f:
                f.write("\n".join(notes) + "\n")
            return 0
    except (LookupError, OSError, subprocess.CalledProcessError) as e:
        sys.stderr.write("bundle: %s\n" % e)
        return 1
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
