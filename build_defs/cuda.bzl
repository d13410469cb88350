"""cuda_library: compiles .cu files with the system nvcc into a static archive.

Only for builds with the CUDA toolkit (@cuda//:defs.bzl CUDA_AVAILABLE):
callers put their CUDA targets behind that flag (runtime/hal/BUILD).
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE")

def cuda_library(
        name,
        srcs,
        hdrs = [],
        deps = [],
        sm_archs = ["90"],
        ptx_archs = ["90"],
        nvcc_flags = [],
        **kwargs):
    """Compiles `srcs` (.cu) with nvcc and wraps the archive as a cc_library.

    Each .cu becomes one object (nvcc -c, sm_XX SASS plus compute_XX PTX),
    archived with the C++ toolchain's ar in deterministic mode, so member
    names are stable (nvcc -lib names them tmpxft_...).

    Args:
      name: target name (a cc_library).
      srcs: .cu files.
      hdrs: headers used by srcs and exported to dependents.
      deps: cc deps of the resulting library.
      sm_archs: SASS targets, e.g. ["90"] -> sm_90.
      ptx_archs: PTX (JIT) targets, e.g. ["90"] -> compute_90.
      nvcc_flags: extra nvcc flags.
      **kwargs: passed to the cc_library.
    """
    if not CUDA_AVAILABLE:
        fail("cuda_library(%s): this build has no CUDA toolkit; guard the target with @cuda//:defs.bzl CUDA_AVAILABLE" % name)
    gencode = ["-gencode=arch=compute_%s,code=sm_%s" % (a, a) for a in sm_archs]
    gencode += ["-gencode=arch=compute_%s,code=compute_%s" % (a, a) for a in ptx_archs]
    archive = "lib%s_nvcc.a" % name
    nvcc_cmd = " ".join([
        "$$NVCC -c -ccbin $(CC) -std=c++17 -O2 -Xcompiler -fPIC",
        " ".join(gencode),
        " ".join(nvcc_flags),
        "-I. -I$(GENDIR)",
    ])
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs,
        outs = [archive],
        tools = ["@cuda//:bin/nvcc"],
        toolchains = ["@bazel_tools//tools/cpp:current_cc_toolchain"],
        # nvcc finds include/, nvvm/ and crt/ relative to argv[0]: run the real
        # path, not the sandbox symlink.
        cmd = " ".join([
            "set -e;",
            "NVCC=$$(readlink -f $(location @cuda//:bin/nvcc));",
            "T=$$(mktemp -d); OBJS=;",
            "for s in %s; do" % " ".join(["$(location %s)" % s for s in srcs]),
            "  o=$$T/$$(basename $$s).o;",
            "  %s -o $$o $$s;" % nvcc_cmd,
            "  OBJS=\"$$OBJS $$o\";",
            "done;",
            "$(AR) rcsD $@ $$OBJS; rm -rf $$T",
        ]),
        message = "nvcc %s" % name,
    )
    native.cc_import(
        name = name + "_archive",
        static_library = archive,
        alwayslink = True,
    )
    native.cc_library(
        name = name,
        hdrs = hdrs,
        deps = [":" + name + "_archive", "@cuda//:cudart_static"] + deps,
        **kwargs
    )
