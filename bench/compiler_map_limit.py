"""What XLA's CPU compiler does at the kernel's limit on a process's memory maps (vm.max_map_count).

Maps single pages until ``LEAVE`` maps are left below the limit, then compiles small programs, each of which maps
regions of its own: at the limit LLVM's allocation fails ("LLVM compilation error: Cannot allocate memory") and the
process segfaults in ``backend_compile_and_load`` (bench/RESULTS.md, "The compiler's segfault").

    .venv/bin/python -X faulthandler bench/compiler_map_limit.py 400     # segfaults
    .venv/bin/python -X faulthandler bench/compiler_map_limit.py 3000    # compiles them all
"""
import ctypes
import mmap
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

LIMIT = int(open("/proc/sys/vm/max_map_count").read())


def maps() -> int:
    with open("/proc/self/maps") as handle:
        return sum(1 for _ in handle)


def take_maps(count: int) -> None:
    """Maps ``count`` single pages, alternately read-only and writable, so that no two merge into one map."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    for index in range(count):
        protection = mmap.PROT_READ if index % 2 else mmap.PROT_READ | mmap.PROT_WRITE
        libc.mmap(None, mmap.PAGESIZE, protection, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)


def main() -> None:
    leave = int(sys.argv[1])
    jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
    take_maps(LIMIT - leave - maps())
    print(f"maps before compiling: {maps()} of {LIMIT}", flush=True)
    kept = []
    for width in range(5, 400):
        kept.append(jax.jit(lambda x: jax.nn.gelu(x) * 2 + jnp.tanh(x)).lower(jnp.ones((width,))).compile())
        if width % 20 == 0:
            print(f"{len(kept)} programs compiled, {maps()} maps", flush=True)
    print(f"done: {len(kept)} programs, {maps()} maps")


if __name__ == "__main__":
    main()
