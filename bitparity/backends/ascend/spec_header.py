"""Generates kernels/spec_constants.h, the kernels' copy of spec.py's constants.

The Ascend C kernels are compiled by bisheng on an NPU host (CMakeLists.txt)
as well as by g++ here, so they cannot read spec.py: they read this generated
header.  tests/backends/test_ascend_emulation.py fails when the header is not
exactly what render() produces, so it cannot drift from spec.py.

Regenerate with:  python -m bitparity.backends.ascend.spec_header
"""

from pathlib import Path

from ... import spec

HEADER = Path(__file__).resolve().parent / "kernels" / "spec_constants.h"


def _constants():
    """spec.py's upper-case int and tuple constants, by name."""
    return {name: value for name, value in sorted(vars(spec).items())
            if name.isupper() and isinstance(value, (int, tuple))}


def _is_pattern(name):
    return name.endswith(("_BITS", "_MAGIC"))


def render():
    """The text of kernels/spec_constants.h for the spec.py being imported."""
    lines = [
        "// Generated from bitparity/spec.py by bitparity/backends/ascend/spec_header.py: do not edit.",
        f"// SPEC_VERSION {spec.SPEC_VERSION}.  Float constants are IEEE-754 binary32 bit patterns;",
        "// the kernels turn them into floats with FloatFromBits (canonical.h).",
        "#ifndef BITPARITY_SPEC_CONSTANTS_H",
        "#define BITPARITY_SPEC_CONSTANTS_H",
        "",
        "#include <cstdint>",
        "",
        "namespace bitparity {",
        "",
    ]
    constants = _constants()
    lines += [f"constexpr uint32_t {name} = {value}u;" for name, value in constants.items()
              if isinstance(value, int) and not _is_pattern(name)]
    lines.append("")
    lines += [f"constexpr uint32_t {name} = 0x{value:08X}u;  // {spec.f32(value)!r}"
              for name, value in constants.items() if isinstance(value, int) and _is_pattern(name)]
    for name, values in constants.items():
        if isinstance(values, tuple):
            terms = name.removesuffix("_BITS") + "_TERMS"
            lines += ["", f"// {name}, in spec.py's order", f"constexpr uint32_t {terms} = {len(values)}u;",
                      f"constexpr uint32_t {name}[{terms}] = {{"]
            lines += [f"    0x{v:08X}u,  // {spec.f32(v)!r}" for v in values]
            lines.append("};")
    lines += ["", "}  // namespace bitparity", "", "#endif  // BITPARITY_SPEC_CONSTANTS_H", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    HEADER.write_text(render())
    print(f"wrote {HEADER}")
