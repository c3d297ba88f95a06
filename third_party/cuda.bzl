"""Repository rule exposing /usr/local/cuda (or $CUDA_PATH) when it exists.

With CUDA present, @local_cuda//:cuda carries the CUDA runtime and cuBLAS headers and link
flags, @local_cuda//:nccl_headers the NCCL headers, and @local_cuda//:nvcc the compiler.
Without it, every target exists but is empty and :available is False, so the tree builds.
"""

def _impl(repository_ctx):
    cuda_path = repository_ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    present = repository_ctx.path(cuda_path + "/include/cuda_runtime.h").exists
    nvcc = repository_ctx.path(cuda_path + "/bin/nvcc").exists
    if present:
        repository_ctx.symlink(cuda_path + "/include", "include")
        build = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp", "include/*.hpp",
                 "include/cuda/**", "include/nv/**", "include/cuda_bf16*", "include/cuda_fp16*"],
                allow_empty = True),
    includes = ["include"],
    linkopts = ["-L{path}/lib64", "-Wl,-rpath,{path}/lib64", "-lcudart", "-lcublas"],
)

cc_library(
    name = "nccl_headers",
    hdrs = glob(["include/nccl*.h"], allow_empty = True),
    includes = ["include"],
)
""".format(path = cuda_path)
    else:
        build = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda")

cc_library(name = "nccl_headers")
"""
    repository_ctx.file("BUILD.bazel", build)
    repository_ctx.file("defs.bzl", "CUDA_AVAILABLE = {}\nNVCC_AVAILABLE = {}\nCUDA_PATH = \"{}\"\n".format(
        present,
        nvcc,
        cuda_path,
    ))

local_cuda_repository = repository_rule(
    implementation = _impl,
    environ = ["CUDA_PATH"],
    local = True,
)
