"""The `simdev` Python module on every interpreter of the matrix, run
without the shim (these tests are about the module and the device)."""
import textwrap

import pythons


def run(interp, source, memory="1G", prelude="", **kw):
    res = pythons.run_python(interp, prelude + textwrap.dedent(source), preload=False,
                             simdev_memory=memory, **kw)
    res.check()
    return res


# Collect until the device memory is back. On PyPy a dead tensor's
# tp_dealloc runs after the collection, outside the GC, so it takes more
# than one call and some bytecode in between; the loop is bounded.
COLLECT = """
import gc
def collect_until(pred, rounds=50):
    for _ in range(rounds):
        if pred():
            return True
        gc.collect()
        [i for i in range(100)]
    return pred()
"""


def test_imports_and_round_trips(interpreter):
    run(interpreter, """
        import simdev
        free0, total = simdev.mem_info()
        assert total == 1 << 30 and free0 == total, simdev.mem_info()
        t = simdev.Tensor(1000)
        assert t.nbytes == 1000
        assert isinstance(t.ptr, int) and t.ptr % 256 == 0 and t.ptr != 0
        assert simdev.mem_info()[0] == total - 1024
        t.fill(0x5a)
        assert t.read() == b"\\x5a" * 1000
        t.write(b"hello")
        assert t.read()[:6] == b"hello\\x5a"
        t.write(bytearray(b"\\x01" * 1000))
        assert t.read() == b"\\x01" * 1000
        t.write(memoryview(b"xy"))
        assert t.read()[:3] == b"xy\\x01"
        u = simdev.Tensor(3000, release_gil=True)
        u.fill(0)
        assert u.read() == bytes(3000)
        assert u.ptr != t.ptr
        e = simdev.Tensor(0)
        assert e.ptr == 0 and e.nbytes == 0 and e.read() == b""
        e.fill(1)
        for bad in (lambda: t.fill(256), lambda: t.fill(-1), lambda: t.write(b"x" * 1001),
                    lambda: simdev.Tensor(-1)):
            try:
                bad()
            except ValueError:
                pass
            else:
                raise AssertionError("no ValueError")
        del t, u, e
        import gc; gc.collect()
        print("ok")
    """)


def test_out_of_memory_is_a_memory_error(interpreter):
    run(interpreter, prelude=COLLECT, source="""
        import simdev
        assert issubclass(simdev.OutOfMemoryError, MemoryError)
        big = simdev.Tensor(1 << 20)
        assert simdev.mem_info() == (0, 1 << 20)
        for release in (False, True):
            try:
                simdev.Tensor(1, release_gil=release)
            except MemoryError as e:
                assert type(e) is simdev.OutOfMemoryError, type(e)
            else:
                raise AssertionError("no OutOfMemoryError at capacity")
        del big
        assert collect_until(lambda: simdev.mem_info() == (1 << 20, 1 << 20)), simdev.mem_info()
        simdev.Tensor(1 << 20)
    """, memory="1M")


def test_cycles_through_tensors_are_collected(interpreter):
    run(interpreter, prelude=COLLECT, source="""
        import gc, simdev, weakref
        total = simdev.mem_info()[1]
        gc.disable()  # only our explicit collections free the cycles
        refs = []
        for i in range(20):
            a = simdev.Tensor(1 << 20)
            a.me = a                       # self cycle
            b = simdev.Tensor(1 << 20, release_gil=True)
            c = simdev.Tensor(1 << 20)
            b.other, c.other = c, b        # two-tensor cycle
            d = simdev.Tensor(1 << 20)
            d.box = [d, {"x": d}]          # cycle through containers
            refs.append(weakref.ref(a))
            del a, b, c, d
        used = total - simdev.mem_info()[0]
        assert used == 80 << 20, used      # refcounting alone frees none of it
        assert collect_until(lambda: simdev.mem_info()[0] == total), simdev.mem_info()
        assert all(r() is None for r in refs)
        print("ok")
    """, memory="128M")


def test_tensor_dict_and_repr(interpreter):
    run(interpreter, """
        import simdev
        t = simdev.Tensor(256)
        t.name = "x"
        assert t.__dict__ == {"name": "x"}
        assert "simdev.Tensor" in repr(t) and "nbytes=256" in repr(t)
        assert simdev.Tensor.__module__ == "simdev"
    """)


def test_module_can_be_imported_twice(interpreter):
    run(interpreter, """
        import sys
        import simdev as m1
        del sys.modules["simdev"]
        import simdev as m2
        assert m1 is not m2 and m1.Tensor is not m2.Tensor
        assert m1.OutOfMemoryError is not m2.OutOfMemoryError
        a, b = m1.Tensor(512), m2.Tensor(512)
        assert m2.mem_info()[0] == m2.mem_info()[1] - 1024
    """)


def test_subinterpreter_imports_it(interpreter):
    if interpreter.kind == "pypy":
        pythons.need("subinterpreters", "PyPy has no subinterpreters")
    run(interpreter, """
        try:
            import _interpreters as subs
        except ImportError:
            import _xxsubinterpreters as subs
        import simdev
        outer = simdev.Tensor(256)
        code = (
            "import simdev\\n"
            "t = simdev.Tensor(4096)\\n"
            "t.fill(3)\\n"
            "assert t.read() == bytes([3]) * 4096\\n"
            "try:\\n"
            "    simdev.Tensor(1 << 40)\\n"
            "except MemoryError:\\n"
            "    pass\\n"
            "else:\\n"
            "    raise AssertionError('no OutOfMemoryError')\\n"
        )
        sub = subs.create()
        err = subs.run_string(sub, code)
        assert err is None, err
        subs.destroy(sub)
        assert simdev.mem_info()[0] == simdev.mem_info()[1] - 256, simdev.mem_info()
    """)


def test_debug_build_leaks_no_references(interpreter):
    if not interpreter.debug:
        pythons.need("py-debug", "sys.gettotalrefcount needs a debug build")
    run(interpreter, """
        import gc, sys, simdev
        def churn():
            for i in range(2000):
                t = simdev.Tensor(512)
                t.me = t
                t.write(b"abc"); t.read(); t.fill(1)
                try:
                    simdev.Tensor(1 << 40)
                except simdev.OutOfMemoryError:
                    pass
            gc.collect()
        churn()
        before = sys.gettotalrefcount()
        churn()
        after = sys.gettotalrefcount()
        assert after - before < 100, (before, after)
    """)


def test_free_threaded_build_keeps_the_gil_off():
    interp = pythons.get("cpython3.13t").require()
    res = run(interp, """
        import sys, warnings
        warnings.simplefilter("error")
        import simdev
        assert sys._is_gil_enabled() is False
        import threading
        def work():
            for _ in range(200):
                t = simdev.Tensor(4096, release_gil=True)
                t.me = t
                t.fill(7)
                assert t.read() == b"\\x07" * 4096
        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        import gc; gc.collect()
        assert simdev.mem_info()[0] == simdev.mem_info()[1], simdev.mem_info()
        print("gil", sys._is_gil_enabled())
    """)
    assert "gil False" in res.stdout
    assert "RuntimeWarning" not in res.stderr, res.stderr
