"""Names for native frames the process did not name: the reader looks the
frame's object up in the trace's module map (its path, and the frame's
offset in that file) and reads the object's own symbol tables, .symtab and
.dynsym (a stripped binary keeps the dynamic one: the functions it
exports). Used by trace.py for frames without a symbol record (a process
killed before its names were written at exit) or whose record has no name.

A frame is named only by a function symbol whose range holds it (st_value
<= address < st_value + st_size): an address inside a hidden function of
a stripped object stays unnamed rather than named after the nearest
exported one. The file is read as it is now: a file replaced since the
run (an upgrade) can name a frame wrongly, which is why the process's own
names, written at exit, are preferred wherever they exist. ELF64
little-endian only (x86-64, AArch64); anything else gives no names.

Owns a cache of the tables read (per path); no other state. Demangles C++
names with the C++ runtime's own __cxa_demangle (ctypes) where present.
"""

import bisect
import ctypes
import ctypes.util
import mmap
import struct

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
PT_LOAD = 1
MAX_BYTES = 1 << 31      # an object larger than this is not read

_cache = {}
_demangler = []


class _Object(object):
    __slots__ = ("loads", "starts", "syms")

    def __init__(self):
        self.loads = []      # (file offset, file size, vaddr) of each PT_LOAD
        self.starts = []     # sorted symbol starts
        self.syms = []       # (start, end, name), same order


def _read(path):
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            (_ident, _type, _mach, _ver, _entry, phoff, shoff, _flags, _ehsize, phentsize,
             phnum, shentsize, shnum, _shstrndx) = _EHDR.unpack(head)
            f.seek(0, 2)
            size = f.tell()
            if size > MAX_BYTES:
                return None
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    o = _Object()
    try:
        for i in range(phnum if phentsize == _PHDR.size else 0):
            p_type, _fl, off, vaddr, _pa, filesz, _memsz, _al = _PHDR.unpack_from(
                data, phoff + i * phentsize)
            if p_type == PT_LOAD:
                o.loads.append((off, filesz, vaddr))
        secs = [_SHDR.unpack_from(data, shoff + i * shentsize)
                for i in range(shnum if shentsize == _SHDR.size else 0)]
        found = {}
        for _name, sh_type, _fl, _addr, off, sz, link, _info, _al, entsize in secs:
            if sh_type not in (SHT_SYMTAB, SHT_DYNSYM) or entsize != _SYM.size or link >= len(secs):
                continue
            stroff, strsz = secs[link][4], secs[link][5]
            for k in range(sz // entsize):
                st_name, st_info, _other, shndx, value, ssize = _SYM.unpack_from(
                    data, off + k * entsize)
                if shndx == 0 or ssize == 0 or (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC):
                    continue
                if st_name >= strsz:
                    continue
                a = stroff + st_name
                e = data.find(b"\0", a)
                if e < 0:
                    continue
                name = data[a:e].decode("utf-8", "surrogateescape")
                if not name:
                    continue
                # .symtab first (it holds the static functions too); a
                # .dynsym entry of the same start adds nothing.
                if value not in found or sh_type == SHT_SYMTAB and found[value][2] == SHT_DYNSYM:
                    found[value] = (value + ssize, name.split("@", 1)[0], sh_type)
    except (struct.error, ValueError, IndexError):
        return None
    finally:
        data.close()
    for start in sorted(found):
        end, name, _t = found[start]
        o.starts.append(start)
        o.syms.append((start, end, name))
    return o


def _object(path):
    if path not in _cache:
        _cache[path] = _read(path)
    return _cache[path]


def demangle(name):
    """A C++ symbol's readable name (the name itself when it is not one, or
    when the C++ runtime is not there)."""
    if not name.startswith("_Z"):
        return name
    if not _demangler:
        fn = None
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            fn = lib.__cxa_demangle
            fn.restype = ctypes.c_void_p
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_int)]
        except (OSError, AttributeError):
            fn = None
        _demangler.append(fn)
    fn = _demangler[0]
    if fn is None:
        return name
    status = ctypes.c_int()
    p = fn(name.encode("utf-8", "surrogateescape"), None, None, ctypes.byref(status))
    if not p or status.value != 0:
        return name
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(p))


def function_at(path, offset):
    """The name of the function that holds file offset `offset` of object
    `path` (a return address's offset: the call is the byte before it),
    from its symbol tables; None when none holds it or it cannot be read."""
    o = _object(path) if path and path.startswith("/") else None
    if o is None or offset is None:
        return None
    off = offset - 1 if offset else 0
    vaddr = None
    for foff, fsz, va in o.loads:
        if foff <= off < foff + fsz:
            vaddr = off - foff + va
            break
    if vaddr is None:
        return None
    i = bisect.bisect_right(o.starts, vaddr) - 1
    if i < 0:
        return None
    start, end, name = o.syms[i]
    return demangle(name) if start <= vaddr < end else None
