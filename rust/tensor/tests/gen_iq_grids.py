"""Writes rust/tensor/src/scalar/iq_grids.rs: the i-quant grids and sign tables of ggml's
ggml-common.h (the copy vendored in llama-cpp-python 0.3.36) as Rust `const` data.

Run from the repository root with the path of ggml-common.h:
python3 rust/tensor/tests/gen_iq_grids.py .../vendor/llama.cpp/ggml/src/ggml-common.h
"""
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "scalar" / "iq_grids.rs"
TABLES = {  # ggml name -> (Rust name, Rust element type, what it holds)
    "kmask_iq2xs": ("KMASK_IQ2XS", "u8", "bit j of a sign byte"),
    "ksigns_iq2xs": ("KSIGNS_IQ2XS", "u8", "7 stored sign bits -> 8 with even parity"),
    "iq2xxs_grid": ("IQ2XXS_GRID", "u64", "IQ2_XXS: 8 magnitudes (bytes) per index"),
    "iq2xs_grid": ("IQ2XS_GRID", "u64", "IQ2_XS: 8 magnitudes (bytes) per index"),
    "iq2s_grid": ("IQ2S_GRID", "u64", "IQ2_S: 8 magnitudes (bytes) per index"),
    "iq3xxs_grid": ("IQ3XXS_GRID", "u32", "IQ3_XXS: 4 magnitudes (bytes) per index"),
    "iq3s_grid": ("IQ3S_GRID", "u32", "IQ3_S: 4 magnitudes (bytes) per index"),
    "iq1s_grid": ("IQ1S_GRID", "u64", "IQ1_S and IQ1_M: 8 values -1, 0, 1 (signed bytes) per index"),
}


def main() -> None:
    text = Path(sys.argv[1]).read_text()
    out = ["//! The i-quant grids and sign tables of ggml's ggml-common.h, as data (written by",
           "//! tests/gen_iq_grids.py; do not edit by hand).", ""]
    for name, (rust, ty, what) in TABLES.items():
        m = re.search(r"GGML_TABLE_BEGIN\(\w+, " + name + r", (\w+)\)(.*?)GGML_TABLE_END\(\)", text, re.S)
        body = re.sub(r"//[^\n]*", "", m.group(2))
        values = [v for v in re.split(r"[,\s]+", body) if v]
        per_line = 8 if ty != "u8" else 16
        out.append(f"/// {what} (ggml's {name}).")
        out.append(f"pub const {rust}: [{ty}; {len(values)}] = [")
        for i in range(0, len(values), per_line):
            out.append("    " + ", ".join(values[i:i + per_line]) + ",")
        out.append("];")
        out.append("")
    OUT.write_text("\n".join(out))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
