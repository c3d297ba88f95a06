"""Repository rule for the system Python 3 headers (Debian's python3-dev).

Uses /usr/bin/python3 (not whatever python3 is first on PATH) because the extension must load
into the interpreter that has python3-torch.
"""

def _impl(repository_ctx):
    python = repository_ctx.os.environ.get("LBCC_PYTHON", "/usr/bin/python3")
    result = repository_ctx.execute([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
    include = result.stdout.strip() if result.return_code == 0 else ""
    if include and repository_ctx.path(include + "/Python.h").exists:
        repository_ctx.symlink(include, "include")
        build = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)
"""
    else:
        build = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "headers")
"""
    repository_ctx.file("BUILD.bazel", build)
    repository_ctx.file("defs.bzl", "PYTHON = \"{}\"\n".format(python))

local_python_repository = repository_rule(
    implementation = _impl,
    environ = ["LBCC_PYTHON"],
    local = True,
)
