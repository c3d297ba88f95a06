"""Build macros shared by LBCC packages."""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_test")

def lbcc_fuzz_test(name, srcs, deps, corpus, **kwargs):
    """A libFuzzer target and its corpus-replay test.

    Creates `<name>`: a test that runs LLVMFuzzerTestOneInput once over every file in `corpus`
    (a folder in the package), part of `bazel test //...`; and `<name>_fuzzer`: the libFuzzer
    binary, built only with --config=fuzz (tagged manual):

        bazel run --config=fuzz //codecs:payload_fuzz_fuzzer -- -max_total_time=600 \\
            /tmp/corpus $PWD/codecs/testdata/payload_corpus
    """
    data = native.glob([corpus + "/**"])
    if not data:
        fail("lbcc_fuzz_test {}: corpus folder {} is empty".format(name, corpus))
    cc_test(
        name = name,
        size = "small",
        srcs = srcs,
        # Tests run from the workspace root of their runfiles.
        args = [native.package_name() + "/" + corpus],
        data = data,
        deps = deps + ["//base:fuzz_replay_main"],
        **kwargs
    )
    cc_binary(
        name = name + "_fuzzer",
        testonly = True,
        srcs = srcs,
        deps = deps,
        tags = ["manual", "fuzz"],
        **kwargs
    )

# nvcc flags: device code for A100 (sm_80) and H100/H200 (sm_90), plus PTX for newer chips.
# No FMA contraction: the codecs' kernels reproduce the CPU codecs' fp32 operations (they also
# spell them with _rn intrinsics, which are never contracted).
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-ffp-contract=off",
    "-fmad=false",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def lbcc_cuda_library(name, cu_srcs, hdrs, host_fallback_srcs, deps = [], cuda_host_srcs = [],
                      copts = [], **kwargs):
    """A library whose CUDA sources are compiled by nvcc under --config=cuda.

    With --config=cuda (and nvcc present at $CUDA_PATH, default /usr/local/cuda) each file of
    `cu_srcs` becomes an object compiled by nvcc for sm_80 and sm_90 and links with the CUDA
    runtime, and `cuda_host_srcs` (C++ that calls the CUDA runtime; cuda_runtime.h is on the
    include path) are compiled by the host compiler. Without it the library is built from
    `host_fallback_srcs`, which must implement the same header and report Unimplemented for
    device work.

    nvcc sees the package's own headers, the files listed in `hdrs` (kernels/ lists there the
    nvcc-clean headers it shares with base/ and codecs/: host_device.h, rounding.h, ...) and
    CUDA's; .cu files include nothing else from other packages.
    """
    objects = []
    for src in cu_srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + [h for h in native.glob(["**/*.h", "**/*.cuh"]) if h not in hdrs] + hdrs,
            outs = [obj],
            cmd = ("CUDA=$${CUDA_PATH:-/usr/local/cuda}; " +
                   "$$CUDA/bin/nvcc " + " ".join(NVCC_FLAGS) +
                   " -I. -c $(location " + src + ") -o $@"),
            # Built only through the select below (--config=cuda), never by //... .
            tags = ["cuda", "manual"],
            visibility = ["//visibility:private"],
        )
        objects.append(":" + obj)
    native.cc_library(
        name = name,
        srcs = select({
            "//third_party:cuda_enabled": objects + cuda_host_srcs,
            "//conditions:default": host_fallback_srcs,
        }),
        copts = copts,
        hdrs = hdrs,
        deps = deps + select({
            "//third_party:cuda_enabled": ["//third_party:cuda"],
            "//conditions:default": [],
        }),
        defines = select({
            "//third_party:cuda_enabled": ["LBCC_WITH_CUDA=1"],
            "//conditions:default": [],
        }),
        **kwargs
    )
