// C++ exceptions under the shim with leak checking on: libunwind, which the
// shim loads for stacks, must not take over _Unwind_RaiseException. Throws
// and catches through several frames while allocating device memory, then
// prints "caught N" (N = the number of throws) and leaks one block.
#include <cstdio>
#include <stdexcept>
#include <string>

#include "simdev.h"

__attribute__((noinline)) static void thrower(int i)
{
    void *p = nullptr;
    if (simdevMalloc(&p, 256) != simdevSuccess)
        throw std::runtime_error("alloc failed");
    simdevFree(p);
    throw std::runtime_error("boom " + std::to_string(i));
}

__attribute__((noinline)) static void middle(int i)
{
    std::string keep = "frame with a destructor";
    thrower(i);
}

__attribute__((noinline)) void leak_from_cxx()
{
    void *p = nullptr;
    simdevMalloc(&p, 3000);
}

int main()
{
    const int n = 1000;
    int caught = 0;
    for (int i = 0; i < n; i++) {
        try {
            middle(i);
        } catch (const std::runtime_error &e) {
            if (std::string(e.what()) == "boom " + std::to_string(i))
                caught++;
        }
    }
    leak_from_cxx();
    std::printf("caught %d\n", caught);
    return caught == n ? 0 : 1;
}
