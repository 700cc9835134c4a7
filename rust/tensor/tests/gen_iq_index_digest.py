"""Prints the digests in tests/iq_index.rs: FNV-1a 64 of ggml's own grid indices (the
kgrid_q2xs / kmap_q2xs / kneighbors_q2xs arrays iq2xs_init_impl builds), read from the memory
of llama-cpp-python 0.3.36's libggml-base.so after ggml_quantize_init.

The arrays sit behind ggml-quants.c's static `iq2_data[4]` (not an exported symbol): its address
is read off the disassembly of the exported iq2xs_free_impl (the one `lea ...(%rip)` it does).
Each entry is {uint64_t *grid; int *map; uint16_t *neighbours}; the neighbours' length is the
end of the last list the map points to.

Run with the reference build's Python, from the repository root:
/work/bench-venv/bin/python rust/tensor/tests/gen_iq_index_digest.py
"""

import ctypes
import re
import subprocess
from pathlib import Path

import llama_cpp
import numpy as np

LIB = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
BASE = ctypes.CDLL(str(LIB), mode=ctypes.RTLD_GLOBAL)
KMAP_SIZE = 43692
# (name in the test, ggml type id, grid size, slot in iq2_data)
GRIDS = [("XXS", 16, 256, 0), ("XS", 17, 512, 1), ("S", 22, 1024, 3), ("IQ1", 19, 2048, 2)]


def symbol_offset(name: str) -> int:
    out = subprocess.run(["nm", "-D", str(LIB)], capture_output=True, text=True, check=True).stdout
    return int(next(l.split()[0] for l in out.splitlines() if l.endswith(" " + name) or l.split()[-1].startswith(name + "@")), 16)


def iq2_data_offset() -> int:
    start = symbol_offset("iq2xs_free_impl")
    dis = subprocess.run(["objdump", "-d", f"--start-address={start:#x}", f"--stop-address={start + 0x80:#x}", str(LIB)],
                         capture_output=True, text=True, check=True).stdout
    targets = re.findall(r"lea\s+0x[0-9a-f]+\(%rip\),%r\w+\s+# ([0-9a-f]+)", dis)
    assert len(targets) == 1, dis
    return int(targets[0], 16)


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main() -> None:
    load_base = ctypes.cast(BASE.iq2xs_free_impl, ctypes.c_void_p).value - symbol_offset("iq2xs_free_impl")
    entries = (ctypes.c_void_p * 12).from_address(load_base + iq2_data_offset())
    for name, ty, size, slot in GRIDS:
        BASE.ggml_quantize_init(ctypes.c_int(ty))
        grid_p, map_p, neigh_p = entries[3 * slot: 3 * slot + 3]
        grid = np.ctypeslib.as_array((ctypes.c_uint64 * size).from_address(grid_p)).copy()
        kmap = np.ctypeslib.as_array((ctypes.c_int32 * KMAP_SIZE).from_address(map_p)).copy()
        neg = -kmap[kmap < 0] - 1
        counts = np.ctypeslib.as_array((ctypes.c_uint16 * (int(neg.max()) + 1)).from_address(neigh_p))
        length = int(max(o + 1 + counts[o] for o in neg))
        neigh = np.ctypeslib.as_array((ctypes.c_uint16 * length).from_address(neigh_p)).copy()
        print(f"// {name}: neighbours {length}")
        print(f"({name}, 0x{fnv1a(grid.astype('<u8').tobytes()):016x}, 0x{fnv1a(kmap.astype('<i4').tobytes()):016x}, "
              f"{length}, 0x{fnv1a(neigh.astype('<u2').tobytes()):016x}),")


if __name__ == "__main__":
    main()
