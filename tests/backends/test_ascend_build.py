"""What can be checked of the Ascend NPU build without CANN or an NPU.

No bisheng, CANN toolkit or NPU is available here, so the NPU build has never
run (docs/ascend.md).  These tests check what this machine allows:
  * with -Werror: every kernel source under the host emulation, all in the one
    translation unit that CMakeLists.txt generates for CANN >= 9.1 and each
    alone (as CANN 8.x's ascendc_library compiles them); and the torch_npu
    binding in its CANN 8.x form, against torch's headers and stand-ins for
    torch_npu's stream and the generated launchers;
  * the kernel sources hold no build-specific branch, use no Ascend C API
    outside kernels/ALLOWED_API.txt, and none of the vendor's math or reductions;
  * the kernels' entry points, the host emulation's launches, the binding's
    launches and op registrations, and the backend's NPU calls name the same
    kernels and ops, and every contract op has an NPU path;
  * CMakeLists.txt, run in CMake's script mode with the CANN and torch
    commands stubbed, takes every kernel source under both CANN toolchains,
    and npu_build.sh fails clearly without CANN or torch_npu.
"""
import ast
import inspect
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bitparity.backends import _build, ascend
from bitparity.backends import numpy as numpy_backend
from bitparity.backends.ascend import host_emulation, npu_ops
from bitparity.compare.run import OPS

ROOT = Path(__file__).resolve().parents[2]
ASCEND = Path(ascend.__file__).resolve().parent
KERNEL_DIR = host_emulation.KERNEL_DIR
ALLOWED_API_FILE = KERNEL_DIR / "ALLOWED_API.txt"
BINDING = ASCEND / "npu" / "bitparity_npu.cpp"
LAUNCH = host_emulation.EMULATION_DIR / "launch.cpp"
KERNEL_FILES = host_emulation.KERNEL_SOURCES + host_emulation.KERNEL_HEADERS

# g++ and cmake are test prerequisites (README): a missing one fails these tests, never skips them.
needs_gxx = pytest.mark.usefixtures("_gxx")
needs_cmake = pytest.mark.usefixtures("_cmake")


@pytest.fixture
def _gxx():
    assert host_emulation.compiler() is not None, "the host emulation needs g++ (a test prerequisite, README)"


@pytest.fixture
def _cmake():
    assert shutil.which("cmake") is not None, "the build-file checks need cmake >= 3.18 (a test prerequisite, README)"


def _strip_comments_and_strings(text):
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


# ---- Compiling under the emulation with -Werror -----------------------------------

# The emulation library's own flags (backends/_build.py and host_emulation.py), with warnings made errors.
WERROR_FLAGS = (*_build.COMMON_FLAGS, *host_emulation.FLAGS, "-Werror",
                f"-I{host_emulation.EMULATION_DIR}", f"-I{KERNEL_DIR}")


def _compile(jobs):
    """Run g++ with each job's arguments, as many at a time as there are cores;
    returns {job: compiler output} for the jobs that failed."""
    def one(item):
        name, args = item
        result = subprocess.run([host_emulation.compiler(), *args], capture_output=True, text=True)
        return name, result.returncode, result.stderr
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return {name: err for name, status, err in pool.map(one, jobs.items()) if status != 0}


def _object(source, out_dir):
    return [*WERROR_FLAGS, "-c", str(source), "-o", str(out_dir / f"{source.name}.o")]


# Stand-ins for what only CANN and torch_npu provide, so that the CANN 8.x binding (host C++) compiles
# here: torch_npu's current-stream call, and one launcher per kernel declared from the kernel's own
# parameters, GM_ADDR passed as void* (as ascendc_library's generated aclrtlaunch_<kernel>.h declares it).
NPU_STREAM_STUB = """#pragma once
using aclrtStream = void*;
namespace c10_npu {
struct NPUStream { aclrtStream stream(bool flushTaskQueue) const; };
NPUStream getCurrentNPUStream();
}
"""
_KERNEL_SIGNATURE = re.compile(r"__global__\s+__aicore__\s+void\s+(bitparity_\w+)\s*\(([^)]*)\)")


def _binding_stubs(stub_dir):
    (stub_dir / "torch_npu/csrc/core/npu").mkdir(parents=True)
    (stub_dir / "torch_npu/csrc/core/npu/NPUStream.h").write_text(NPU_STREAM_STUB)
    for source in host_emulation.KERNEL_SOURCES:
        for kernel, params in _KERNEL_SIGNATURE.findall(source.read_text()):
            params = " ".join(re.sub(r"\bGM_ADDR\b", "void*", params).split())
            (stub_dir / f"aclrtlaunch_{kernel}.h").write_text(
                "#pragma once\n#include <cstdint>\n#define ACLRT_LAUNCH_KERNEL(kernel) aclrtlaunch_##kernel\n"
                f'extern "C" uint32_t aclrtlaunch_{kernel}(uint32_t blockDim, void* stream, {params});\n')


@needs_gxx
@needs_cmake
def test_kernels_and_binding_compile_without_warnings(tmp_path):
    """-Wall -Wextra -Werror.  The kernels, with the emulation's flags (-O2, so the optimiser's warnings
    count too): all of them to one object as the one translation unit the CANN >= 9.1 build compiles
    (the header CMakeLists.txt generates), and each alone as CANN 8.x's ascendc_library compiles it
    (-fsyntax-only: its object code is the unit's); the emulation's runtime and launches to objects.
    The binding as the CANN 8.x build compiles it (host C++20 against torch's headers, with the
    stand-ins above and the launcher includes CMakeLists.txt generates).  Its CANN >= 9.1 form
    (<<<>>> launches) needs bisheng and is not compiled here."""
    from torch.utils.cpp_extension import include_paths

    unity = tmp_path / "unity.cpp"
    unity.write_text(_configure(tmp_path / "cann9", "asc").header)
    cann8 = _configure(tmp_path / "cann8", "ascendc_library")
    generated = tmp_path / "cann8" / "build" / "generated"
    _binding_stubs(generated)
    failures = _compile({
        "all kernels in one unit": _object(unity, tmp_path),
        "each kernel alone": [*WERROR_FLAGS, "-fsyntax-only", *map(str, host_emulation.KERNEL_SOURCES)],
        "runtime.cpp": _object(host_emulation.RUNTIME_SOURCE, tmp_path),
        "launch.cpp": _object(LAUNCH, tmp_path),
        "binding (CANN 8.x)": ["-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
                               "-DBITPARITY_ACLRT_LAUNCH=1", f"-I{generated}", f"-I{KERNEL_DIR}",
                               *(f"-isystem{p}" for p in include_paths()), str(BINDING)],
    })
    assert cann8.status == 0, cann8.output
    assert not failures, "\n".join(f"{name}:\n{err}" for name, err in failures.items())


@needs_gxx
def test_werror_flags_reject_a_warning(tmp_path):
    """The flags above do turn a warning into a failure, in both kinds of kernel job."""
    source = tmp_path / "warns.cpp"
    source.write_text('#include "kernel_operator.h"\nint f() { int unused = 0; return 1; }\n')
    failures = _compile({"object": _object(source, tmp_path), "alone": [*WERROR_FLAGS, "-fsyntax-only", str(source)]})
    assert set(failures) == {"object", "alone"} and all("unused" in err for err in failures.values()), failures


def test_kernel_sources_have_no_build_specific_branches():
    """The emulation and both NPU builds compile the same kernel code: no #if/#ifdef/#else in kernels/
    apart from include guards, so no build can see different kernel code."""
    branches = [f"{p.name}: {line.strip()}" for p in KERNEL_FILES for line in p.read_text().splitlines()
                if re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else)\b", line)
                and not re.match(r"\s*#\s*ifndef\s+BITPARITY_\w+_H\s*$", line)]
    assert not branches, branches


# ---- The API-subset guard ------------------------------------------------------

# Vendor instructions and high-level APIs whose rounding or reduction order is the vendor's, not the spec's.
# Refused even if ALLOWED_API.txt listed them, and even as a name the kernels define themselves.
FORBIDDEN = frozenset((
    "Exp", "Exp2", "Ln", "Log", "Log2", "Log10", "Div", "Divs", "Reciprocal", "Sqrt", "Rsqrt", "Power",
    "ReduceSum", "WholeReduceSum", "BlockReduceSum", "ReduceRepeat", "ReduceMax", "WholeReduceMax",
    "BlockReduceMax", "FusedMulAdd", "FusedMulAddRelu", "Axpy", "MulAddDst", "MulAddRelu", "SoftMax",
    "LogSoftMax", "SimpleSoftMax", "Sum", "Mean"))

# A name the kernels define: a type, namespace, template parameter, alias, macro, constant, function or enumerator.
_DEFINITIONS = (
    re.compile(r"\b(?:class|struct|enum\s+class|enum|namespace|typename)\s+([A-Za-z_]\w*)"),
    re.compile(r"#\s*(?:define|ifndef)\s+(\w+)"),
    re.compile(r"\bconstexpr\s+[\w:]+\s+(\w+)"),
    re.compile(r"\busing\s+(\w+)\s*="),
    re.compile(r"__aicore__\s+inline\s+[^;{}()]*?\b(\w+)\s*\("),
)
_TEMPLATE = re.compile(r"\btemplate\s*<([^<>]*)>")
_ENUM_BODY = re.compile(r"\benum\s+(?:class\s+)?\w+(?:\s*:\s*[\w:]+)?\s*\{([^}]*)\}")
# Identifiers that look like Ascend C: qualified by AscendC::, capitalised, or __dunder__.
_API_LIKE = re.compile(r"\bAscendC::(\w+)|\b([A-Z]\w*|__\w+__)\b")


def allowed_api():
    """ALLOWED_API.txt: name -> reason."""
    entries = {}
    for line in ALLOWED_API_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition("#")
            entries[name.strip()] = reason.strip()
    return entries


def defined_names(texts):
    """The names the kernel sources define themselves."""
    names = set()
    for text in texts:
        for pattern in _DEFINITIONS:
            names.update(pattern.findall(text))
        for params in _TEMPLATE.findall(text):
            names.update(re.findall(r"(\w+)\s*(?:,|$)", params.strip()))
        for body in _ENUM_BODY.findall(text):
            names.update(re.findall(r"(\w+)\s*(?:=[^,]*)?(?:,|$)", body.strip()))
    return names


def api_violations(sources, allowed):
    """(source name, identifier, why) for each Ascend C-like identifier outside the allowed subset.

    sources: {name: text}.  An AscendC:: name must be in `allowed`; a capitalised or __dunder__ name must
    be in `allowed` or defined by the sources; a FORBIDDEN name is refused either way."""
    texts = {name: _strip_comments_and_strings(text) for name, text in sources.items()}
    own = defined_names(texts.values())
    found = set()
    for name, text in texts.items():
        for match in _API_LIKE.finditer(text):
            qualified, bare = match.groups()
            ident = qualified or bare
            if ident in FORBIDDEN:
                found.add((name, ident, "vendor math or reduction: its rounding and order are not the spec's"))
            elif ident not in allowed and (qualified or ident not in own):
                found.add((name, ident, "not in kernels/ALLOWED_API.txt"))
    return sorted(found)


def _kernel_texts():
    return {p.name: p.read_text() for p in KERNEL_FILES}


def test_kernels_use_only_the_allowed_api():
    assert {p.name for p in KERNEL_FILES} >= {"canonical.h", "tiling.h", "reduce.cpp", "softmax.cpp",
                                              "elementwise.cpp", "masked.cpp", "kl.cpp", "gae.cpp", "ppo.cpp",
                                              "linear.cpp", "rms_norm.cpp", "rotary.cpp", "attention.cpp",
                                              "silu_mul.cpp", "fold_rows.cpp", "optim.cpp", "row_fold.h"}
    violations = api_violations(_kernel_texts(), allowed_api())
    assert not violations, f"Ascend C API outside the allowed subset: {violations}"


def test_allowed_api_is_documented_modelled_and_used():
    """Every allowed name has a reason, none is vendor math, each is modelled by the emulation header,
    and each is used by a kernel (the list is the subset in use, not a wish list)."""
    allowed = allowed_api()
    assert all(allowed.values()), [name for name, reason in allowed.items() if not reason]
    assert not FORBIDDEN & set(allowed)
    emulation = host_emulation.EMULATION_HEADER.read_text()
    assert not [n for n in allowed if not re.search(rf"\b{re.escape(n)}\b", emulation)], "not modelled"
    used = {ident for text in _kernel_texts().values()
            for m in _API_LIKE.finditer(_strip_comments_and_strings(text)) for ident in m.groups() if ident}
    assert not set(allowed) - used, f"listed but unused: {sorted(set(allowed) - used)}"


@pytest.mark.parametrize("snippet,ident", [
    ("AscendC::ReduceSum<float>(a, b, c, n);", "ReduceSum"),
    ("Exp(y, x, n);", "Exp"),
    ("AscendC::Ln(y, x, n);", "Ln"),
    ("AscendC::FusedMulAdd(y, a, b, n);", "FusedMulAdd"),
    ("__aicore__ inline void Div(float& a) { a = a; }", "Div"),                 # a kernel's own name, still refused
    ("AscendC::PipeBarrier<PIPE_V>();", "PipeBarrier"),                           # real API, not in the subset
    ("AscendC::Abs(y, x, n);", "Abs"),
    ("AscendC::Fail(\"x\");", "Fail"),                                             # an emulation internal
    ("float* p = AscendC::emu::Data(t);", "Data"),
])
def test_api_guard_rejects(snippet, ident):
    violations = api_violations({"snippet.cpp": snippet}, allowed_api())
    assert ident in {v[1] for v in violations}, violations


def test_api_guard_accepts_the_allowed_subset_and_own_names():
    snippet = """
    enum class Mode { FAST, EXACT };
    constexpr uint32_t TILE = 64;
    template <typename T, Mode MODE>
    __aicore__ inline void CanonicalThing(const AscendC::LocalTensor<T>& y, const AscendC::LocalTensor<T>& x)
    {
        AscendC::Add(y, x, x, TILE);   // ReduceSum would be refused, but not in a comment
        AscendC::Select(y, bits, x, y, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, TILE);
    }
    """
    assert api_violations({"snippet.cpp": snippet}, allowed_api()) == []


# ---- One op list: kernels, emulation launches, NPU binding, backend calls ---------------------

_ENTRY = re.compile(r"__global__\s+__aicore__\s+void\s+(bitparity_\w+)\s*\(")


def kernel_entries():
    return {e for p in host_emulation.KERNEL_SOURCES for e in _ENTRY.findall(p.read_text())}


def _bodies(text, definition):
    """{name: body text up to the next definition} for each definition the regex's group 1 names."""
    matches = list(definition.finditer(text))
    return {m.group(1): text[m.end():matches[i + 1].start() if i + 1 < len(matches) else len(text)]
            for i, m in enumerate(matches)}


def emulation_launches():
    """launch.cpp: op -> the kernel its bp_<op> entry point launches."""
    bodies = _bodies(_strip_comments_and_strings(LAUNCH.read_text()), re.compile(r"^int bp_(\w+)\(", re.M))
    return {op: re.findall(r"\b(bitparity_\w+)\(", body) for op, body in bodies.items()}


def binding_ops(text):
    """npu/bitparity_npu.cpp's text: (schema names, impl name -> function, function -> kernels it launches)."""
    schemas = re.findall(r'm\.def\("(\w+)\(', text)
    impls = dict(re.findall(r'm\.impl\("(\w+)",\s*TORCH_FN\(bitparity_npu::(\w+)\)\)', text))
    definition = re.compile(r"^(?:at::Tensor|std::tuple<[^>]*>)\s+(\w+)\(", re.M)
    launches = {fn: re.findall(r"BITPARITY_LAUNCH\((bitparity_\w+),", body)
                for fn, body in _bodies(_strip_comments_and_strings(text), definition).items()}
    return schemas, impls, launches


def backend_npu_ops():
    """The op names ascend/__init__.py passes to npu_ops.op()."""
    tree = ast.parse(inspect.getsource(ascend))
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "op"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "npu_ops"}


def op_list_problems(binding_text):
    """Where the kernels, the emulation's launches, the binding and the backend disagree on the op list."""
    entries = kernel_entries()
    emulated = emulation_launches()
    schemas, impls, launches = binding_ops(binding_text)
    problems = []
    if {f"bp_{op}" for op in emulated} != set(host_emulation._SIGNATURES):
        problems.append(f"launch.cpp {sorted(emulated)} vs host_emulation._SIGNATURES")
    if len(schemas) != len(set(schemas)) or set(schemas) != set(impls):
        problems.append(f"TORCH_LIBRARY {sorted(schemas)} vs TORCH_LIBRARY_IMPL {sorted(impls)}")
    if set(impls) != set(emulated):
        problems.append(f"binding ops {sorted(impls)} vs emulation ops {sorted(emulated)}")
    for op in set(impls) & set(emulated):
        if launches.get(impls[op]) != emulated[op]:
            problems.append(f"{op}: the binding launches {launches.get(impls[op])}, the emulation {emulated[op]}")
    if {k for ks in emulated.values() for k in ks} != entries:
        problems.append(f"kernel entry points {sorted(entries)} vs those the emulation launches")
    if backend_npu_ops() != set(impls):
        problems.append(f"ops ascend/__init__.py calls on the NPU {sorted(backend_npu_ops())} vs the binding's")
    if f"TORCH_LIBRARY({npu_ops.NAMESPACE}, m)" not in binding_text:
        problems.append(f"the binding does not register torch.ops.{npu_ops.NAMESPACE}")
    return problems


def test_emulation_and_binding_launch_every_kernel_for_the_same_ops():
    assert op_list_problems(BINDING.read_text()) == []


def test_op_list_check_catches_a_missing_or_crossed_binding():
    """Negative controls: one impl line dropped, and one op launching another op's kernel."""
    text = BINDING.read_text()
    dropped = text.replace('    m.impl("log", TORCH_FN(bitparity_npu::LogOp));\n', "")
    crossed = text.replace("BITPARITY_LAUNCH(bitparity_log,", "BITPARITY_LAUNCH(bitparity_exp,")
    assert dropped != text and crossed != text
    assert any("TORCH_LIBRARY_IMPL" in p for p in op_list_problems(dropped))
    assert any(p.startswith("log: the binding launches ['bitparity_exp']") for p in op_list_problems(crossed))


# The model building blocks of the backend contract (spec 24; moe is composed of them in ops.py).
MODEL_OPS = ("linear", "rms_norm", "rotary", "attention", "silu_mul")

# The backward of the contract (spec 26), and the kernel file each sits in, beside its forward.
BACKWARD_KERNELS = {
    "logsumexp_backward": "softmax.cpp", "log_softmax_backward": "softmax.cpp", "softmax_backward": "softmax.cpp",
    "entropy_backward": "softmax.cpp", "token_logprobs_backward": "softmax.cpp",
    "masked_mean_backward": "masked.cpp", "masked_whiten_backward": "masked.cpp",
    "kl_penalty_backward": "kl.cpp", "ppo_policy_loss_backward": "ppo.cpp",
}
BACKWARD_OPS = tuple(BACKWARD_KERNELS)
# Spec 29's training kernels, each beside its forward (fold_rows and the optimizers in their own files).
TRAINING_KERNELS = {"fold_rows": "fold_rows.cpp", "rms_norm_backward": "rms_norm.cpp",
                    "silu_mul_backward": "silu_mul.cpp", "attention_backward": "attention.cpp",
                    "adamw_step": "optim.cpp", "sgd_step": "optim.cpp"}


def test_backward_ops_are_the_contracts_and_their_kernels_sit_beside_the_forwards():
    """The backward names (spec 26's nine, spec 29's three) are the numpy backend's (the contract's) and the ascend backend's, each with an
    entry point bitparity_<op> in its forward's kernel file (ppo's token weights beside them), so the guards
    above (API subset, -Werror, one op list) cover them like every forward."""
    backward = set(BACKWARD_OPS) | {op for op in TRAINING_KERNELS if op.endswith("_backward")}
    assert {n for n in dir(numpy_backend) if n.endswith("_backward")} == backward
    assert {n for n in dir(ascend) if n.endswith("_backward")} == backward
    for op, file in {**BACKWARD_KERNELS, **TRAINING_KERNELS}.items():
        assert f"bitparity_{op}" in _ENTRY.findall((KERNEL_DIR / file).read_text()), (op, file)
    assert "bitparity_ppo_token_weights" in _ENTRY.findall((KERNEL_DIR / "ppo.cpp").read_text())
    assert {f"bitparity_{op}" for op in BACKWARD_OPS} <= kernel_entries()


def test_every_contract_op_has_an_npu_path():
    """Each op of the backend contract reaches npu_ops.op() in ascend/__init__.py, directly or through the
    module's own helpers (ppo_policy_loss: ppo_token_losses, then masked_mean and sum, as in the emulation)."""
    tree = ast.parse(inspect.getsource(ascend))
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}

    def reaches_npu(name, seen):
        fn = functions[name]
        if any(isinstance(n, ast.Attribute) and n.attr == "op" and getattr(n.value, "id", "") == "npu_ops"
               for n in ast.walk(fn)):
            return True
        called = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        return any(reaches_npu(c, seen | {name}) for c in called if c in functions and c not in seen)

    contract = [op for op in (*OPS, *MODEL_OPS, *BACKWARD_OPS, *TRAINING_KERNELS)
                if hasattr(numpy_backend, op)]   # beam_search_step, moe: ops.py
    assert set(MODEL_OPS) <= set(contract) and set(BACKWARD_OPS) <= set(contract)
    missing = [op for op in contract if op not in functions or not reaches_npu(op, frozenset())]
    assert not missing, f"contract ops with no NPU path in the ascend backend: {missing}"


# ---- CMakeLists.txt in CMake's script mode ---------------------------------------------

# Stubs for the commands that need a project or CANN; each records its arguments.  find_package is
# real for ASC (it finds, or not, the fake CANN tree's asc-config.cmake) and stubbed for Python3/Torch.
HARNESS = r"""
set(CMAKE_CURRENT_SOURCE_DIR "${SOURCE_DIR}")
set(CMAKE_CURRENT_BINARY_DIR "${BINARY_DIR}")
set(CMAKE_BINARY_DIR "${BINARY_DIR}")
function(record what)
    message(STATUS "RECORD ${what} ${ARGN}")
endfunction()
macro(find_package name)
    if("${name}" STREQUAL "Python3")
        set(Python3_EXECUTABLE python3)
    elseif("${name}" STREQUAL "Torch")
        set(TORCH_LIBRARIES torch)
    else()
        _find_package(${ARGV})
    endif()
endmacro()
function(execute_process)
    cmake_parse_arguments(PARSE_ARGV 0 ARG "OUTPUT_STRIP_TRAILING_WHITESPACE"
                          "RESULT_VARIABLE;OUTPUT_VARIABLE;ERROR_VARIABLE" "COMMAND")
    set(${ARG_RESULT_VARIABLE} 0 PARENT_SCOPE)
    set(${ARG_OUTPUT_VARIABLE} "/site-packages/x" PARENT_SCOPE)
endfunction()
foreach(command project add_library set_source_files_properties target_compile_definitions
        target_compile_options target_include_directories target_link_directories target_link_libraries
        set_target_properties)
    cmake_language(EVAL CODE "function(${command})\n record(${command} \${ARGV})\nendfunction()")
endforeach()
include("${SOURCE_DIR}/CMakeLists.txt")
"""

FAKE_ASCENDC_CMAKE = """
function(ascendc_library)
    record(ascendc_library ${ARGV})
endfunction()
function(ascendc_compile_options)
    record(ascendc_compile_options ${ARGV})
endfunction()
"""


class Configured:
    def __init__(self, result, binary_dir):
        self.status = result.returncode
        self.output = " ".join((result.stdout + result.stderr).split())   # CMake wraps long messages
        self.calls = {}
        for line in result.stdout.splitlines():
            if line.startswith("-- RECORD "):
                what, _, args = line.removeprefix("-- RECORD ").partition(" ")
                self.calls.setdefault(what, []).append(args.split(";"))
        header = binary_dir / "generated" / "bitparity_kernels.h"
        self.header = header.read_text() if header.exists() else ""


def _configure(cann, toolchain_files, *defines, env_home=True):
    """Run CMakeLists.txt under the harness against a fake CANN tree: "asc" gives it asc-config.cmake
    (CANN >= 9.1), "ascendc_library" gives it tools/tikcpp/ascendc_kernel_cmake/ascendc.cmake (CANN 8.x)."""
    tree = {"asc": ("compiler/tikcpp/ascendc_kernel_cmake/asc-config.cmake", ""),
            "ascendc_library": ("tools/tikcpp/ascendc_kernel_cmake/ascendc.cmake", FAKE_ASCENDC_CMAKE)}
    for kind in toolchain_files.split():
        path, text = tree[kind]
        (cann / path).parent.mkdir(parents=True, exist_ok=True)
        (cann / path).write_text(text)
    cann.mkdir(parents=True, exist_ok=True)
    harness = cann / "harness.cmake"
    harness.write_text(HARNESS)
    binary_dir = cann / "build"
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_HOME_PATH"}
    if env_home:
        env["ASCEND_HOME_PATH"] = str(cann)
    result = subprocess.run(["cmake", f"-DSOURCE_DIR={ASCEND}", f"-DBINARY_DIR={binary_dir}", *defines,
                             "-P", str(harness)], capture_output=True, text=True, env=env)
    return Configured(result, binary_dir)


def _one(configured, command):
    calls = configured.calls.get(command, [])
    assert len(calls) == 1, (command, configured.calls)
    return calls[0]


@needs_cmake
def test_cmake_cann9_compiles_every_kernel_source_in_the_binding_unit(tmp_path):
    c = _configure(tmp_path, "asc ascendc_library")   # both present: auto prefers asc
    assert c.status == 0, c.output
    assert "CANN toolchain asc" in c.output
    assert _one(c, "project")[1:] == ["LANGUAGES", "ASC", "CXX"]
    assert _one(c, "add_library") == ["bitparity_npu", "SHARED", str(BINDING)]
    assert _one(c, "set_source_files_properties") == [str(BINDING), "PROPERTIES", "LANGUAGE", "ASC"]
    options = [o for call in c.calls["target_compile_options"] for o in call]
    assert "$<$<COMPILE_LANGUAGE:ASC>:--npu-arch=dav-2201>" in options and "-ffp-contract=off" in options
    assert ["bitparity_npu", "PRIVATE", "BITPARITY_ACLRT_LAUNCH=0"] in c.calls["target_compile_definitions"]
    included = re.findall(r'#include "(.+)"', c.header)
    assert included == ["kernel_operator.h", *map(str, host_emulation.KERNEL_SOURCES)]
    assert "ascendc_library" not in c.calls


@needs_cmake
def test_cmake_cann8_builds_every_kernel_with_ascendc_library(tmp_path):
    c = _configure(tmp_path, "ascendc_library")
    assert c.status == 0, c.output
    assert "CANN toolchain ascendc_library" in c.output
    assert _one(c, "project")[1:] == ["LANGUAGES", "CXX"]
    assert _one(c, "ascendc_library") == ["bitparity_kernels", "SHARED", *map(str, host_emulation.KERNEL_SOURCES)]
    assert "-ffp-contract=off" in _one(c, "ascendc_compile_options")
    assert ["bitparity_npu", "PRIVATE", "BITPARITY_ACLRT_LAUNCH=1"] in c.calls["target_compile_definitions"]
    assert ["bitparity_npu", "PRIVATE", "bitparity_kernels"] in c.calls["target_link_libraries"]
    launchers = re.findall(r'#include "aclrtlaunch_(\w+)\.h"', c.header)
    assert sorted(launchers) == sorted(kernel_entries()) and len(launchers) == len(set(launchers))
    assert "set_source_files_properties" not in c.calls


@needs_cmake
def test_cmake_fails_clearly(tmp_path):
    no_home = _configure(tmp_path / "a", "asc", env_home=False)
    assert no_home.status != 0 and "ASCEND_HOME_PATH is not set" in no_home.output
    no_asc = _configure(tmp_path / "b", "ascendc_library", "-DBITPARITY_CANN_TOOLCHAIN=asc")
    assert no_asc.status != 0 and "ASC" in no_asc.output and "RECORD project" not in no_asc.output
    neither = _configure(tmp_path / "c", "")
    assert neither.status != 0 and "no ascendc_kernel_cmake/ascendc.cmake" in neither.output
    typo = _configure(tmp_path / "d", "asc", "-DBITPARITY_CANN_TOOLCHAIN=ascend")
    assert typo.status != 0 and "expected auto, asc or ascendc_library" in typo.output


# ---- scripts/npu_build.sh ---------------------------------------------------------

BUILD_SCRIPT = ROOT / "scripts" / "npu_build.sh"


def _build_script(tmp_path, **env):
    environment = {k: v for k, v in os.environ.items() if k != "ASCEND_HOME_PATH"} | env
    return subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, env=environment)


def test_npu_build_fails_clearly_without_cann(tmp_path):
    result = _build_script(tmp_path, CANN_SET_ENV=str(tmp_path / "missing" / "set_env.sh"))
    assert result.returncode != 0 and "CANN not found" in result.stderr, result.stderr


def test_npu_build_sources_cann_and_fails_clearly_without_torch_npu(tmp_path):
    cann = tmp_path / "cann"
    cann.mkdir()
    set_env = tmp_path / "set_env.sh"
    set_env.write_text(f"export ASCEND_HOME_PATH={cann}\n")
    python = tmp_path / "python-without-torch-npu"   # torch imports (quickly: a stand-in), torch_npu does not
    python.write_text('#!/bin/sh\ncase "$2" in *torch_npu*) exit 1;; *__version__*) echo 2.13.0;; esac\n')
    python.chmod(0o755)
    result = _build_script(tmp_path, CANN_SET_ENV=str(set_env), PYTHON=str(python))
    assert f"sourcing {set_env}" in result.stdout
    assert result.returncode != 0 and "cannot import torch_npu" in result.stderr, result.stderr
