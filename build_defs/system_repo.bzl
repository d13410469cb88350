"""Repository rules that expose preinstalled system packages to Bazel (no downloads)."""

def _soname_of(rctx, libdir, name):
    """Returns the versioned file name that lib<name>.so points to (e.g. libMLIR.so.22.1)."""
    p = rctx.path("%s/%s" % (libdir, name))
    if not p.exists:
        fail("system library not found: %s" % p)
    res = rctx.execute(["readlink", str(p)])
    if res.return_code == 0 and res.stdout.strip():
        return res.stdout.strip().split("/")[-1]
    return name

def _system_repo_impl(rctx):
    for dst, src in rctx.attr.links.items():
        if not rctx.path(src).exists:
            fail("%s: %s does not exist (install the Debian package that provides it)" % (rctx.name, src))
        rctx.symlink(src, dst)
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")

system_repo = repository_rule(
    implementation = _system_repo_impl,
    attrs = {
        "links": attr.string_dict(mandatory = True),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
    },
    local = True,
)

def _system_llvm_impl(rctx):
    ver = rctx.os.environ.get("LLVM_VERSION", rctx.attr.version)
    root = "/usr/lib/llvm-%s" % ver
    for f in ["include/mlir/IR/OpBase.td", "lib/libMLIR.so", "lib/libLLVM.so", "bin/mlir-tblgen", "bin/FileCheck"]:
        if not rctx.path(root + "/" + f).exists:
            fail("LLVM/MLIR %s incomplete: %s/%s missing (apt-get install libmlir-%s-dev mlir-%s-tools llvm-%s-dev llvm-%s-tools)" % (ver, root, f, ver, ver, ver, ver))
    for d in ["include", "lib", "bin"]:
        rctx.symlink(root + "/" + d, d)

    # llvm-22-tools ships bin/lit; llvm-19-tools only build/utils/lit/lit.py.
    lit = root + "/bin/lit"
    if not rctx.path(lit).exists:
        lit = root + "/build/utils/lit/lit.py"
    rctx.symlink(lit, "lit_runner")
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{LLVM_VERSION}": ver,
        "%{MLIR_SO}": _soname_of(rctx, root + "/lib", "libMLIR.so"),
        "%{LLVM_SO}": _soname_of(rctx, root + "/lib", "libLLVM.so"),
    })

system_llvm = repository_rule(
    implementation = _system_llvm_impl,
    attrs = {
        "version": attr.string(mandatory = True),
        "_build_tpl": attr.label(default = "//third_party:llvm.BUILD.tpl", allow_single_file = True),
    },
    environ = ["LLVM_VERSION"],
    local = True,
)

