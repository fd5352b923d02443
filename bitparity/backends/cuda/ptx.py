"""What a Triton kernel becomes on a GPU, compiled offline, without one.

``compile_offline`` compiles kernels for sm_90 (H100/H200) and returns their
PTX and, where the nvdisasm that ships with triton is present, their SASS.
The triton wheel also ships ptxas, which the compiler queries for the PTX
version even to emit PTX; no GPU or CUDA toolkit is needed.

The compile runs in a subprocess (``python -m bitparity.backends.cuda.ptx``)
with TRITON_INTERPRET=0: in a process where TRITON_INTERPRET=1 was set when a
kernel was decorated (as the cuda backend sets it on a machine without a GPU),
every @triton.jit function is an interpreted one that cannot be compiled.

Used by tests/backends/test_cuda_ptx.py (every backend kernel, fusion off)
and by ``bitparity demo fma`` (``multiply_add_kernel`` with fusion on and off).
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

ARCH = 90          # sm_90
WARP_SIZE = 32

# Runtime-argument types of multiply_add_kernel, for compile_offline.
MULTIPLY_ADD_SIGNATURE = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "out_ptr": "*fp32"}


@triton.jit
def multiply_add_kernel(a_ptr, b_ptr, c_ptr, out_ptr, BLOCK: tl.constexpr):
    # a, b, c, out: [BLOCK].  out = a*b + c: one fma.rn.f32 with fp fusion on,
    # mul.rn.f32 then add.rn.f32 with it off.
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs)
    b = tl.load(b_ptr + offs)
    c = tl.load(c_ptr + offs)
    tl.store(out_ptr + offs, a * b + c)


def compile_offline(jobs, timeout=600):
    """{name: (module, kernel, signature, constexprs, fusion)} -> {name: {"ptx": str, "sass": str or None}}.

    module and kernel name a @triton.jit function importable in a fresh
    process; signature maps each runtime argument to its Triton type (None:
    an argument left out); constexprs gives the compile-time values; fusion
    is enable_fp_fusion.
    """
    package_root = str(Path(__file__).resolve().parents[3])   # the bitparity being run, not an installed one
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH")))))
    with tempfile.TemporaryDirectory() as tmp:
        jobs_path, out_path = Path(tmp, "jobs.json"), Path(tmp, "out.json")
        jobs_path.write_text(json.dumps(jobs))
        run = subprocess.run([sys.executable, "-m", __name__, str(jobs_path), str(out_path)], env=env,
                             capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0:
            raise RuntimeError(f"offline Triton compile failed:\n{run.stdout}\n{run.stderr}")
        return json.loads(out_path.read_text())


# -- The compile itself, in the subprocess ----------------------------------------

def _compile(fn, signature, constexprs, fusion):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: ty for name, ty in signature.items() if ty is not None}
    signature.update({name: "constexpr" for name in constexprs})
    kernel = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", ARCH, WARP_SIZE),
                            options={"enable_fp_fusion": fusion})
    sass = None
    nvdisasm = triton.knobs.nvidia.nvdisasm.path
    if nvdisasm and os.access(nvdisasm, os.X_OK):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(kernel.asm["cubin"])
            cubin.flush()
            sass = subprocess.run([nvdisasm, cubin.name], capture_output=True, text=True, check=True).stdout
    return {"ptx": kernel.asm["ptx"], "sass": sass}


def _main(jobs_path, out_path):
    import importlib

    if triton.knobs.runtime.interpret:
        raise RuntimeError("TRITON_INTERPRET is set: interpreted kernels cannot be compiled")
    jobs = json.loads(Path(jobs_path).read_text())
    results = {}
    for name, (module, kernel, signature, constexprs, fusion) in jobs.items():
        fn = getattr(importlib.import_module(module), kernel)
        results[name] = _compile(fn, signature, constexprs, fusion)
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    _main(*sys.argv[1:])
