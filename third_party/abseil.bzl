"""Repository rule for Abseil built from source by Bazel (@com_google_absl).

Debian's libabsl-dev ships shared libraries and static archives that are not
position-independent, so neither can go inside LBCC's shared objects. tools/setup unpacks
Debian's own abseil source package (the same release and patches as libabsl-dev, so the same
absl/base/options.h: absl::string_view, absl::optional, absl::variant and the inline namespace
`debian3`) into ~/.cache/lbcc/abseil-VERSION; this rule exposes that folder with the BUILD.bazel
files Abseil ships, and Bazel compiles it like LBCC's own code (position-independent objects for
the shared objects, sanitizer flags under --config=asan/tsan/ubsan).
"""

ABSEIL_VERSION = "20220623.1"

def _impl(repository_ctx):
    home = repository_ctx.os.environ.get("HOME", "")
    source = repository_ctx.path("%s/.cache/lbcc/abseil-%s" % (home, ABSEIL_VERSION))
    if not source.get_child("absl").get_child("base").get_child("options.h").exists:
        fail(("Abseil's source is not at %s: run tools/setup (it unpacks Debian's abseil " +
              "source package there)") % source)
    absl = source.get_child("absl")
    for child in absl.readdir():
        if child.basename != "BUILD.bazel":
            repository_ctx.symlink(child, "absl/" + child.basename)

    # Bazel 4.2.3's own @platforms predates @platforms//cpu:wasm32 and :wasm64: those two
    # settings test --cpu instead (neither matches on x86_64 either way).
    build = repository_ctx.read(absl.get_child("BUILD.bazel"))
    for cpu in ["wasm32", "wasm64"]:
        old = """constraint_values = [
        "@platforms//cpu:%s",
    ],""" % cpu
        if old not in build:
            fail("absl/BUILD.bazel: no @platforms//cpu:%s setting to replace" % cpu)
        build = build.replace(old, "values = {\"cpu\": \"%s\"}," % cpu)
    repository_ctx.file("absl/BUILD.bazel", build)
    repository_ctx.symlink(source.get_child("LICENSE"), "LICENSE")
    repository_ctx.file("WORKSPACE", "workspace(name = \"com_google_absl\")\n")
    repository_ctx.file("BUILD.bazel", "licenses([\"notice\"])\n\nexports_files([\"LICENSE\"])\n")

local_abseil_repository = repository_rule(
    implementation = _impl,
    environ = ["HOME"],
    local = True,
)
